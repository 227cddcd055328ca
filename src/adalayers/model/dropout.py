"""Dropout whose random mask is cheap on a CPU.

    y = x * keep / (1 - q)      keep ~ Bernoulli(1 - q),  q = round(p * 2^15) / 2^15

torch's CPU dropout draws one 32-bit Mersenne-twister number per value (bernoulli_), which costs
more than the matrix multiply next to it: in the token head's training step on CoNLL-2003 it was
the largest single cost. Here one 32-bit draw gives two values' 15-bit uniforms, and the keep mask
is an integer compare written straight into x's dtype. The distribution is Bernoulli as
before, with p rounded to a multiple of 2^-15 (0.2 -> 0.200012) and the scale 1 / (1 - q) exact for
that q. Off the CPU (CUDA's dropout is cheap) and in eval mode it is torch's own dropout.

A module without state: it replaces nn.Dropout anywhere without changing what a state_dict holds.
"""
from __future__ import annotations

import torch
import torch.nn.functional as nnf
from torch import nn

_LEVELS = 1 << 15


def dropout(x: torch.Tensor, p: float, training: bool = True) -> torch.Tensor:
    """nnf.dropout(x, p, training), with the cheap mask on a CPU."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return nnf.dropout(x, p, training)
    q = round(p * _LEVELS)
    if q == 0:
        return x
    n = x.numel()
    words = torch.empty((n + 1) // 2, dtype=torch.int32, device=x.device).random_()
    uniform = words.bitwise_and_(0x7FFF7FFF).view(torch.int16)[:n].view(x.shape)  # two uniforms on 0..32767 a word
    scale = torch.empty_like(x)
    torch.ge(uniform, q, out=scale)  # written as 0/1 in x's dtype: no bool tensor to convert
    scale.mul_(_LEVELS / (_LEVELS - q))
    return x * scale


class Dropout(nn.Module):
    """nn.Dropout with the cheap CPU mask (same argument, same state: none)."""

    def __init__(self, p: float = 0.5):
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability has to be between 0 and 1, got {p}")
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}"
