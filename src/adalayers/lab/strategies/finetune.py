"""Fine-tuning a copy of the base with a standard head.

finetune        every weight of the encoder (embeddings and all layers; not an unused pooler)
finetune-top:N  only the last N transformer layers and the head; embeddings and the layers below
                stay frozen (the "freeze your layers" recipe uses N = 3)
"""
from __future__ import annotations

from dataclasses import dataclass

from adalayers.errors import ConfigError
from adalayers.lab.strategies.base import HarnessStrategy
from adalayers.lab.strategies.fullpass import FullPassModel
from adalayers.lab.strategies.harness import OptimConfig, _f


@dataclass
class FinetuneConfig(OptimConfig):
    lr: float | None = _f(3e-5, "AdamW learning rate (fine-tuning wants 2e-5 .. 5e-5).")
    weight_decay: float = _f(0.01, "AdamW weight decay.")
    schedule: str = _f("linear", "constant, or linear (warm up, then decay to 0).")
    dropout: float = _f(0.1, "Dropout before the output layer.")


@dataclass
class FinetuneTopConfig(FinetuneConfig):
    top: int = _f(3, "Train this many of the last transformer layers (and the head).")
    lr: float | None = _f(5e-5, "AdamW learning rate.")

    def check(self) -> list[str]:
        return super().check() + ([] if self.top >= 1 else [f"top: must be at least 1, got {self.top}"])


class Finetune(HarnessStrategy):
    Config = FinetuneConfig
    shares_base_pass = False
    trains_base = True

    def build(self, cfg, backbone, data):
        model = FullPassModel(backbone, data.kind, data.labels, self.conf.dropout)
        for p in model.core_parameters():
            p.requires_grad_(True)
        return model


class FinetuneTop(HarnessStrategy):
    Config = FinetuneTopConfig
    arg_field = "top"
    shares_base_pass = False
    trains_base = True

    def build(self, cfg, backbone, data):
        model = FullPassModel(backbone, data.kind, data.labels, self.conf.dropout)
        layers = model.base.layers
        if self.conf.top > len(layers):
            raise ConfigError(f"{self.spec}: the base has only {len(layers)} transformer layers")
        for layer in layers[len(layers) - self.conf.top:]:
            layer.requires_grad_(True)
        return model
