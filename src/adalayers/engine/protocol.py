"""What the engine trains: anything with a forward, a loss and trainable parameters.

    out  = model(batch)              # logits (or values): nn.Module.__call__ -> forward(batch)
    loss = model.loss(out, batch)    # a scalar (or one loss per sub-task: the engine sums them)
    model.trainable_parameters()     # what the optimiser updates

Optional hooks, looked up by name (a strategy defines only what it needs):
    param_groups(lr)  -> optimiser groups (default: one group of trainable_parameters())
    backward(loss)    -> replace loss.sum().backward() (PCGrad's per-task gradients)
    after_step()      -> after every optimiser step (an EMA copy of the weights)
    log_extra()       -> more fields for the epoch's JSON line (the layer weights)
The AdaLayers side task (fed by a states source, adalayers.model.states.Fed), every strategy's model and
the multi-task model implement it; the engine knows nothing else about them.
"""
from __future__ import annotations

from typing import Iterable, Protocol, runtime_checkable

import torch
from torch import nn

Batch = dict


@runtime_checkable
class Trainable(Protocol):
    def forward(self, batch: Batch) -> torch.Tensor: ...

    def loss(self, out: torch.Tensor, batch: Batch) -> torch.Tensor: ...

    def trainable_parameters(self) -> Iterable[nn.Parameter]: ...


def trainable(module: nn.Module) -> list[nn.Parameter]:
    """The parameters with requires_grad, in registration order (the default trainable set)."""
    return [p for p in module.parameters() if p.requires_grad]


def count(params: Iterable[nn.Parameter]) -> int:
    return sum(p.numel() for p in params)
