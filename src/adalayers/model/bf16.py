"""The side task's own matrix products in bf16 while it trains (train.head_precision=bf16).

    y = float32( bf16(x) @ bf16(W)^T + bf16(b) )     products accumulated in fp32; W, b stay fp32 (the master copy)

The base keeps train.precision: its hidden states are the main model's (or the cache's). Only the
products of the side task change: the mixer's projections GELU(Z_i) W_i^T and the heads' attention
projections and feed-forward. On CUDA, or on a CPU with bf16 instructions (AVX512-BF16, AMX), such a
product takes about half the time of an fp32 one, and in a run from the hidden-state cache these
products are most of a step. Evaluation, serving and export use fp32 products (or train.precision):
a head trained this way is saved, loaded and served as any other.

On a CPU, oneDNN compiles a kernel for every new shape (about 1 ms) and keeps a bounded number of them.
A token head's batches have a different token count at every step, so the rows are padded with zeros to
a multiple of ROWS and sliced off after: few shapes, each kernel compiled once and reused.
"""
from __future__ import annotations

import torch
import torch.nn.functional as nnf

ROWS = 32


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           dtype: torch.dtype | None = None) -> torch.Tensor:
    """nnf.linear(x, weight, bias), the product in `dtype` (None: as nnf.linear), the result in weight's dtype."""
    if dtype is None:
        return nnf.linear(x, weight, bias)
    lead, n = x.shape[:-1], x[..., 0].numel()
    rows = x.reshape(n, x.shape[-1])
    pad = -n % ROWS if x.device.type == "cpu" else 0
    if pad:
        rows = nnf.pad(rows, (0, 0, 0, pad))
    y = nnf.linear(rows.to(dtype), weight.to(dtype), None if bias is None else bias.to(dtype))
    return y[:n].to(weight.dtype).reshape(*lead, weight.shape[0])


def parse(name: str | None) -> torch.dtype | None:
    """train.head_precision -> the dtype of the side task's products while it trains (None: unchanged)."""
    return torch.bfloat16 if name == "bf16" else None


def training_dtype(module: torch.nn.Module) -> torch.dtype | None:
    """The dtype `module`'s products take now: its train_dtype while it trains, None (unchanged) in eval mode."""
    return module.train_dtype if module.training else None
