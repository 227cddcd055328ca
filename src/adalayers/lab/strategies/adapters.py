"""Houlsby bottleneck adapters (Houlsby et al. 2019) and the two variants of the seed report.

An adapter: x + up(GELU(down(x))), down d -> m, up m -> d, with biases: 2md + d + m parameters.
It sits after the attention output projection and after the feed-forward output projection of
every layer, before that sub-layer's skip connection and LayerNorm. The adapters live on a
private copy of the base (forward hooks on the two projections); the base is frozen apart from
the layers' LayerNorms (trainable unless train_layer_norms is off).

adapters           one adapter module per layer, serving both positions (the report's "Houlsby":
                   2md + d + m per layer; 1,189,632 for BERT-base with m = 64), linear head
adapters-unshared  two modules per layer (4md + 2d + 2m), layer norms tuned, a two-layer tanh
                   classifier (the report's "not shared")
adapters-shared3   one module serves both positions of three consecutive layers (the report's
                   "3-shared": 396,544 for BERT-base)

`disabled` (a set of layer numbers 1..L) switches adapters off per layer: the span ablation.
"""
from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as nnf
from torch import nn

from adalayers.config import LR, Fraction
from adalayers.errors import ModelError
from adalayers.lab.strategies.base import HarnessStrategy
from adalayers.lab.strategies.fullpass import FullPassModel
from adalayers.lab.strategies.harness import OptimConfig, Schedule
from adalayers.settings import setting

# (attention output projection, feed-forward output projection) inside one layer, by family
ATTACH_POINTS = (("attention.output.dense", "output.dense"),   # BERT, RoBERTa, MiniLM, ELECTRA
                 ("attention.attn.o", "output.dense"),         # MPNet
                 ("self_attn.out_proj", "fc2"))                # BART encoder


class Adapter(nn.Module):
    def __init__(self, d: int, m: int, init_std: float = 1e-3):
        super().__init__()
        self.down, self.up = nn.Linear(d, m), nn.Linear(m, d)
        for lin in (self.down, self.up):  # near-identity at the start, as in Houlsby et al.
            nn.init.normal_(lin.weight, std=init_std)
            nn.init.zeros_(lin.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.up(nnf.gelu(self.down(x)))


def attach_points(layer: nn.Module) -> tuple[nn.Module, nn.Module]:
    for attn, ffn in ATTACH_POINTS:
        try:
            return layer.get_submodule(attn), layer.get_submodule(ffn)
        except AttributeError:
            continue
    raise ModelError(f"adapters: cannot find the attention and feed-forward output projections in "
                     f"{type(layer).__name__} (known layouts: {ATTACH_POINTS})")


Classifier = Literal["linear", "tanh"]


class AdaptersConfig(OptimConfig):
    size: int = setting(64, "Bottleneck width m of each adapter.", ge=1)
    share_positions: bool = setting(True, "One module serves both positions of a layer (else two modules per "
                                          "layer).")
    share_layers: int = setting(1, "Consecutive layers that share one set of adapter modules.", ge=1)
    train_layer_norms: bool = setting(True, "Also train the LayerNorms inside the transformer layers.")
    classifier: Classifier = setting("linear", "linear, or tanh (Linear(d, d) + tanh before the output layer).")
    dropout: Fraction = setting(0.1, "Dropout before the output layer.")
    lr: LR | None = setting(3e-4, "AdamW learning rate (Houlsby et al. use 3e-4 on GLUE).")
    schedule: Schedule = "linear"


class AdaptersUnsharedConfig(AdaptersConfig):
    share_positions: bool = False
    classifier: Classifier = "tanh"


class AdaptersShared3Config(AdaptersConfig):
    share_layers: int = setting(3, "Consecutive layers that share one set of adapter modules.", ge=1)


class AdapterModel(FullPassModel):
    def __init__(self, backbone, kind: str, labels: list[str], conf: AdaptersConfig):
        super().__init__(backbone, kind, labels, conf.dropout, tanh_hidden=conf.classifier == "tanh")
        layers = self.base.layers
        per_group = 1 if conf.share_positions else 2
        groups = math.ceil(len(layers) / conf.share_layers)
        self.adapters = nn.ModuleList(Adapter(backbone.hidden_size, conf.size) for _ in range(groups * per_group))
        self.disabled: set[int] = set()
        for i, layer in enumerate(layers):
            first = (i // conf.share_layers) * per_group
            for position, module in enumerate(attach_points(layer)):
                module.register_forward_hook(self._hook(i + 1, first + position % per_group))
            if conf.train_layer_norms:
                for m in layer.modules():
                    if isinstance(m, nn.LayerNorm):
                        m.requires_grad_(True)

    def _hook(self, layer_number: int, index: int):
        def hook(_module, _args, output):
            return output if layer_number in self.disabled else self.adapters[index](output)
        return hook


class Adapters(HarnessStrategy):
    Config = AdaptersConfig
    shares_base_pass = False

    def build(self, cfg, backbone, data):
        return AdapterModel(backbone, data.kind, data.labels, self.conf)

    def extra(self, model) -> dict:
        return {"adapter_params": sum(p.numel() for p in model.adapters.parameters()),
                "adapter_modules": len(model.adapters)}


class AdaptersUnshared(Adapters):
    Config = AdaptersUnsharedConfig


class AdaptersShared3(Adapters):
    Config = AdaptersShared3Config
