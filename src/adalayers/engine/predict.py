"""The one prediction loop: a model's outputs for every row of a split, in row order.

    outs[i] = transform(model(collate(batch)).float())[j]   for row i at place j of its batch

`plan` lists the batches (lists of row indices; evaluation sorts rows by length to pad less,
`in_order` keeps them as they come). `model` is any callable batch -> output: a Trainable, or the
serving path's one base pass for many heads, whose output (the base's own output and every head's
logits) is not a tensor and goes to `transform` as it is.
Under torchrun the batches are dealt out to the ranks and the outputs gathered on every rank, so
every rank returns the same list (`shard=False`: this process does every batch, e.g. a server).
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


def in_order(n: int, batch_size: int, generator: torch.Generator | None = None) -> list[list[int]]:
    """Rows 0..n-1 in batches of batch_size: in order, or shuffled by `generator`."""
    order = torch.randperm(n, generator=generator).tolist() if generator is not None else list(range(n))
    return [order[s: s + batch_size] for s in range(0, n, batch_size)]


@torch.no_grad()
def predict(model, plan: list[list[int]], collate: Callable[[list[int]], dict], num_rows: int,
            transform: Callable[[torch.Tensor], list] | None = None, autocast=None, shard: bool = True) -> list:
    if hasattr(model, "eval"):
        model.eval()
    transform = transform or (lambda out: out.cpu())
    mine = []
    for idx in distributed.deal(plan) if shard else plan:
        batch = collate(idx)
        with autocast() if autocast else contextlib.nullcontext():
            out = model(batch)
        values = transform(out.float() if isinstance(out, torch.Tensor) else out)
        mine += [(i, values[j]) for j, i in enumerate(idx)]
    outs: list = [None] * num_rows
    for part in distributed.gather(mine) if shard else [mine]:
        for i, value in part:
            outs[i] = value
    return outs
