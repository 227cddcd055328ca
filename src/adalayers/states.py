"""Where hidden states come from during training and evaluation.

LiveStates runs the frozen base on every batch and taps its layers as they are computed.
A cache (adalayers.cache) offers the same `run(batch, tasks)` and reads stored states instead.
"""
from __future__ import annotations

from adalayers.backbone import Backbone, BaseOutput


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
