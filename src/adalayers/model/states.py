"""Where hidden states come from during training and evaluation.

LiveStates runs the frozen base on every batch and taps its layers as they are computed.
A cache (adalayers.store.cache) offers the same `run(batch, tasks)` and reads stored states instead.
"""
from __future__ import annotations

import torch
from torch import nn

from adalayers.model.backbone import Backbone, BaseOutput


def deepest_layer(tasks) -> int:
    return max(max(t.used_layers()) for t in tasks)


class LiveStates:
    def __init__(self, backbone: Backbone):
        self.backbone = backbone

    def run(self, batch: dict, tasks, primary: bool = False) -> BaseOutput:
        """One base pass feeding every task's accumulator; without `primary` it stops at the deepest used layer."""
        for t in tasks:
            t.begin()
        stop = None if primary else deepest_layer(tasks)
        return self.backbone(batch, taps=[t.tap for t in tasks], stop_after=stop)


class Fed(nn.Module):
    """A side task fed by a states source (live base or cache): the Trainable the engine trains.

        forward(batch) = source.run(batch, [task]); task.end(mask)
    The source is held outside the module tree: .parameters() lists the head's weights only.
    """

    def __init__(self, task, source):
        super().__init__()
        self.task, self._source = task, [source]

    @property
    def kind(self):
        return self.task.kind

    @property
    def labels(self) -> list[str]:
        return self.task.labels

    @property
    def cfg(self):
        """The side task's run config (scoring reads task.positive_label from it)."""
        return self.task.cfg

    def forward(self, batch: dict) -> torch.Tensor:
        self._source[0].run(batch, [self.task])
        return self.task.end(batch["attention_mask"])

    def loss(self, out: torch.Tensor, batch: dict) -> torch.Tensor:
        return self.task.loss(out, batch["labels"].to(out.device))

    def trainable_parameters(self) -> list[nn.Parameter]:
        return self.task.trainable_parameters()

    def param_groups(self) -> list[dict]:
        return self.task.param_groups()

    def log_extra(self) -> dict:
        return {"layer_weights": [round(x, 6) for x in self.task.mixer.layer_weights().tolist()]}
