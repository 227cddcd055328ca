"""The one prediction loop: a model's outputs for every row of a split, in row order.

    outs[i] = transform(model(collate(batch)).float())[j]   for row i at place j of its batch

`plan` lists the batches (lists of row indices; evaluation sorts rows by length to pad less).
Under torchrun the batches are dealt out to the ranks and the outputs gathered on every rank, so
every rank returns the same list.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch

from adalayers.engine import distributed
from adalayers.kinds import TaskKind


def probabilities_or_values(kind: TaskKind | str) -> Callable[[torch.Tensor], list]:
    """Regression: one float per row; classification and tokens: softmax probabilities per row (per token)."""
    if kind == TaskKind.REGRESSION:
        return lambda out: out.cpu().tolist()
    return lambda out: torch.softmax(out, -1).cpu()


@torch.no_grad()
def predict(model, plan: list[list[int]], collate: Callable[[list[int]], dict], num_rows: int,
            transform: Callable[[torch.Tensor], list] | None = None, autocast=None) -> list:
    model.eval()
    transform = transform or (lambda out: out.cpu())
    mine = []
    for idx in distributed.deal(plan):
        batch = collate(idx)
        with autocast() if autocast else contextlib.nullcontext():
            values = transform(model(batch).float())
        mine += [(i, values[j]) for j, i in enumerate(idx)]
    outs: list = [None] * num_rows
    for part in distributed.gather(mine):
        for i, value in part:
            outs[i] = value
    return outs
