"""The AdaLayers recipe itself and its one-layer baselines, trained by adalayers.recipes.service.train.

adalayers     the mixer learns which layers to read (mixer.* of the run config)
single-layer  the same mixer + head pinned to layer N (0 = embedding output): single-layer:N
last-layer    pinned to the last layer
"""
from __future__ import annotations

import copy
from pathlib import Path

from adalayers.recipes import service
from adalayers.store import run as runlib
from adalayers.errors import ConfigError
from adalayers.model.states import LiveStates
from adalayers.lab.strategies.base import Strategy
from adalayers.lab.strategies.harness import Trained, run_shared
from adalayers.settings import Section, setting


class AdaLayersConfig(Section):
    """No settings of its own: the run config's mixer, head and train sections are the method's."""


class SingleLayerConfig(Section):
    layer: int = setting(0, "Which layer the head reads (0 = embedding output).", ge=0)


class AdaLayers(Strategy):
    Config = AdaLayersConfig

    def pin(self, backbone) -> int | None:
        return None

    def train(self, cfg, backbone, data, encoded, out: Path) -> Trained:
        cfg = copy.deepcopy(cfg)
        layer = self.pin(backbone)
        if layer is not None and layer >= backbone.num_layers:
            raise ConfigError(f"{self.spec}: the base has layers 0..{backbone.num_layers - 1}, got {layer}")
        cfg.mixer.pin_layer = layer
        cfg.train.keep = "head"  # the strategy is this head (its run still reports the linear probe)
        metrics = service.train(cfg, Path(out), backbone=backbone, overwrite=True)
        task, _, _ = runlib.load_head(out, backbone)
        task.to(backbone.device).eval()
        source, cache = LiveStates(backbone), []
        return Trained({k: metrics[k] for k in ("validation", "test") if k in metrics}, metrics["trainable_params"],
                       metrics["train_seconds"], metrics["epochs"], metrics["best_epoch"],
                       lambda batch, n: run_shared(source, task, batch, n, cache),
                       {"used_layers": task.used_layers(), "layer_weights": metrics["layer_weights"]})


class SingleLayer(AdaLayers):
    Config = SingleLayerConfig
    arg_field = "layer"

    def pin(self, backbone) -> int:
        return self.conf.layer


class LastLayer(AdaLayers):
    def pin(self, backbone) -> int:
        return backbone.num_layers - 1
