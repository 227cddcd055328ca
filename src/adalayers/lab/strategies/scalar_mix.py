"""Scalar mix (ELMo; Peters et al. 2019): a softmax-weighted sum of the raw hidden states times a
learned scale, no per-layer projection, and the same head as AdaLayers on top (width d instead of k).

    F = gamma * sum_i softmax(s)_i Z_i        s: one scalar per layer (init 0), gamma init 1
"""
from __future__ import annotations

import torch
from torch import nn

from adalayers.errors import ConfigError
from adalayers.model.heads import build_head
from adalayers.lab.strategies.base import HarnessStrategy
from adalayers.engine import task_loss
from adalayers.lab.strategies.harness import OptimConfig, SharedPassModel
from adalayers.kinds import TaskKind


class ScalarMixConfig(OptimConfig):
    """Learning rate defaults to the run config's train.lr (the same as the AdaLayers head)."""


class ScalarMixSide(nn.Module):
    def __init__(self, num_layers: int, hidden_size: int, kind: str, num_labels: int, head_cfg):
        super().__init__()
        if hidden_size % head_cfg.num_heads:
            raise ConfigError(f"scalar-mix: head.num_heads ({head_cfg.num_heads}) must divide the base's "
                              f"hidden size ({hidden_size}), since the head reads the raw states")
        self.kind, self.num_layers = kind, num_layers
        self.s = nn.Parameter(torch.zeros(num_layers))
        self.gamma = nn.Parameter(torch.ones(1))
        self.head = build_head(kind, hidden_size, num_labels, head_cfg)
        self._w, self._acc = None, None

    def used_layers(self) -> list[int]:
        return list(range(self.num_layers))

    def begin(self) -> None:
        self._w, self._acc = torch.softmax(self.s, 0), None

    def tap(self, i: int, z: torch.Tensor) -> None:
        with torch.set_grad_enabled(self.training):
            term = self._w[i] * z.to(self.s.dtype)
            self._acc = term if self._acc is None else self._acc + term

    def end(self, mask: torch.Tensor) -> torch.Tensor:
        out = self.head(self.gamma * self._acc, mask.to(self._acc.device))
        self._acc = None
        return out.squeeze(-1) if self.kind == TaskKind.REGRESSION else out

    def loss(self, logits, labels):
        return task_loss(self.kind, logits, labels)


class ScalarMix(HarnessStrategy):
    Config = ScalarMixConfig

    def build(self, cfg, backbone, data):
        side = ScalarMixSide(backbone.num_layers, backbone.hidden_size, data.kind, max(len(data.labels), 1), cfg.head)
        return SharedPassModel(backbone, side, data.kind, data.labels)

    def extra(self, model) -> dict:
        with torch.no_grad():
            return {"layer_weights": torch.softmax(model.side.s, 0).tolist(), "gamma": model.side.gamma.item()}
