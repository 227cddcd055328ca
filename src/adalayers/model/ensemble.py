"""A seed ensemble: N trained side tasks of one task answering as one, from the same base pass.

    p(y | x) = 1/N * sum_n softmax(logits_n)      (sequence and token tasks; per token for token tasks)
    y(x)     = 1/N * sum_n value_n                 (regression)

`end()` returns log p (for regression the mean value), so softmax(end()) = p and everything that
reads a side task's logits (evaluation, prediction, serving) reads the ensemble unchanged. Each
member taps the same hidden states: the extra inference cost is the members' heads, never another
base pass. A run folder whose config.json lists `ensemble: [member folders]` loads as one
(see run.load_head).
"""
from __future__ import annotations

import torch
from torch import nn
from adalayers.kinds import TaskKind
from adalayers.model.sidetask import end_all


class _MeanWeights:
    """What readers of `task.mixer` ask of an ensemble: its layer count and the members' mean layer weights."""

    def __init__(self, members):
        self.members = members
        self.num_layers = members[0].mixer.num_layers

    def layer_weights(self) -> torch.Tensor:
        return torch.stack([m.mixer.layer_weights() for m in self.members]).mean(0)


class EnsembleTask(nn.Module):
    def __init__(self, members: list):
        super().__init__()
        if not members:
            raise ValueError("an ensemble needs at least one member")
        kinds, labels = {m.kind for m in members}, {tuple(m.labels) for m in members}
        if len(kinds) > 1 or len(labels) > 1:
            raise ValueError(f"ensemble members differ in kind or labels: {sorted(kinds)}, {sorted(labels)}")
        self.members = nn.ModuleList(members)
        self.kind, self.labels, self.cfg = members[0].kind, list(members[0].labels), members[0].cfg
        self.mixer = _MeanWeights(list(self.members))

    def begin(self) -> None:
        for m in self.members:
            m.begin()

    def tap(self, i: int, z: torch.Tensor, projected=None) -> None:
        for m in self.members:
            if m.uses(i):
                m.tap(i, z)

    def uses(self, i: int) -> bool:
        return any(m.uses(i) for m in self.members)

    @property
    def packed_ok(self) -> bool:
        return all(m.packed_ok for m in self.members)

    def used_layers(self) -> list[int]:
        return sorted(set().union(*(m.used_layers() for m in self.members)))

    def layer_weights(self) -> torch.Tensor:
        return self.mixer.layer_weights()

    def end(self, mask: torch.Tensor) -> torch.Tensor:
        outs = [y.float() for y in end_all(list(self.members), mask)]  # the members' heads batched
        if self.kind == TaskKind.REGRESSION:
            return torch.stack(outs).mean(0)
        probs = torch.stack([torch.softmax(o, -1) for o in outs]).mean(0)
        return probs.clamp_min(torch.finfo(probs.dtype).tiny).log()

    def forward(self, hidden_states: list[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
        self.begin()
        for i, z in enumerate(hidden_states):
            self.tap(i, z)
        return self.end(mask)

    def trainable_parameters(self) -> list:
        return [p for m in self.members for p in m.trainable_parameters()]

    def num_trainable(self) -> int:
        return sum(m.num_trainable() for m in self.members)
