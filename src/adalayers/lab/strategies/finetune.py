"""Fine-tuning a copy of the base with a standard head.

finetune        every weight of the encoder (embeddings and all layers; not an unused pooler)
finetune-top:N  only the last N transformer layers and the head; embeddings and the layers below
                stay frozen (the "freeze your layers" recipe uses N = 3)
"""
from __future__ import annotations

from adalayers.config import LR, Fraction, WeightDecay
from adalayers.errors import ConfigError
from adalayers.lab.strategies.base import HarnessStrategy
from adalayers.lab.strategies.fullpass import FullPassModel
from adalayers.lab.strategies.harness import OptimConfig, Schedule
from adalayers.settings import setting


class FinetuneConfig(OptimConfig):
    lr: LR | None = setting(3e-5, "AdamW learning rate (fine-tuning wants 2e-5 .. 5e-5).")
    weight_decay: WeightDecay = 0.01
    schedule: Schedule = "linear"
    dropout: Fraction = setting(0.1, "Dropout before the output layer.")


class FinetuneTopConfig(FinetuneConfig):
    top: int = setting(3, "Train this many of the last transformer layers (and the head).", ge=1)
    lr: LR | None = 5e-5


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
