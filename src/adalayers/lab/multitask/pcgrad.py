"""PCGrad (Yu et al. 2020) on flat per-task gradients of the shared parameters.

The largest-norm task's gradient is kept as it is; every other task's gradient loses its component
along each task gradient it conflicts with (negative dot product; projections against the
original gradients, largest norm first); the results are summed.
"""
from __future__ import annotations

import torch


def combine(grads: list[torch.Tensor]) -> torch.Tensor:
    if len(grads) == 1:
        return grads[0].clone()
    norms = torch.stack([g.norm() for g in grads])
    keep = int(norms.argmax())
    by_norm = sorted(range(len(grads)), key=lambda i: -float(norms[i]))
    out = grads[keep].clone()
    for i in range(len(grads)):
        if i == keep:
            continue
        g = grads[i].clone()
        for j in by_norm:
            if j == i:
                continue
            dot = torch.dot(g, grads[j])
            if dot < 0 and norms[j] > 0:
                g -= dot / norms[j] ** 2 * grads[j]
        out += g
    return out


def flat_grad(params) -> torch.Tensor:
    return torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])


def assign(params, flat: torch.Tensor) -> None:
    i = 0
    for p in params:
        n = p.numel()
        p.grad = flat[i: i + n].view_as(p).clone()
        i += n
