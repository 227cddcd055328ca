"""The seed reports' task heads. Each reads a list of sides: [y] (one text, or a cross-encoded
pair) or [y1, y2] (a bi-encoded pair), every y already extended with upstream heads' outputs.

out = "classes" (logits, cross-entropy), "binary" (one logit, BCE) or "value" (MSE).
"""
from __future__ import annotations

import torch
import torch.nn.functional as nnf
from torch import nn


class SentimentHead(nn.Module):
    """linear -> GELU -> dropout -> linear."""
    sides, out = 1, "classes"

    def __init__(self, d_in: int, n: int, hidden: int, dropout: float):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, hidden), nn.GELU(), nn.Dropout(dropout), nn.Linear(hidden, n))

    def forward(self, sides):
        return self.net(sides[0])


class LinearHead(nn.Module):
    """One linear layer (classes, or one value for regression), after dropout."""
    sides = 1

    def __init__(self, d_in: int, n: int, hidden: int, dropout: float, regression: bool = False):
        super().__init__()
        self.out = "value" if regression else "classes"
        self.dropout, self.linear = nn.Dropout(dropout), nn.Linear(d_in, 1 if regression else n)

    def forward(self, sides):
        y = self.linear(self.dropout(sides[0]))
        return y.squeeze(-1) if self.out == "value" else y


class _PairHead(nn.Module):
    """Two sentences' vectors, each through its own linear map: W1 y1 + b1 and W2 y2 + b2."""
    sides = 2

    def __init__(self, d_in: int, n: int, hidden: int, dropout: float):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.a, self.b = nn.Linear(d_in, hidden), nn.Linear(d_in, hidden)

    def project(self, sides):
        return self.a(self.dropout(sides[0])), self.b(self.dropout(sides[1]))


class BilinearHead(_PairHead):
    """Paraphrase: (W1 y1 + b1)^T (W2 y2 + b2), a logit for binary cross-entropy."""
    out = "binary"

    def forward(self, sides):
        u, v = self.project(sides)
        return (u * v).sum(-1) * self.a.out_features ** -0.5  # initial logits near 0; W1, W2 learn any scale


class CosineHead(_PairHead):
    """Similarity: 5 * relu(cos(W1 y1 + b1, W2 y2 + b2)), for MSE against a 0-5 score."""
    out = "value"

    def forward(self, sides):
        return 5 * torch.relu(nnf.cosine_similarity(*self.project(sides), -1))


def make_head(kind: str, d_in: int, n: int, hidden: int, dropout: float, regression: bool) -> nn.Module:
    if kind == "linear":
        return LinearHead(d_in, n, hidden, dropout, regression)
    return {"sentiment": SentimentHead, "bilinear": BilinearHead, "cosine": CosineHead}[kind](d_in, n, hidden, dropout)


def out_dim(head: nn.Module, n: int) -> int:
    """Width of this head's output as an extra input downstream."""
    return n if head.out == "classes" else 1


def as_feature(head: nn.Module, y: torch.Tensor) -> torch.Tensor:
    """A head's output as a downstream input: class probabilities, a probability, or the value."""
    return feature(head.out, y)


def feature(out: str, y: torch.Tensor) -> torch.Tensor:
    """An output of kind `out` (classes, binary, value) as a downstream input: (B, n) or (B, 1)."""
    if out == "classes":
        return torch.softmax(y, -1)
    return torch.sigmoid(y).unsqueeze(-1) if out == "binary" else y.unsqueeze(-1)


def loss(head: nn.Module, y: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    if head.out == "classes":
        return nnf.cross_entropy(y.float(), labels.long())
    if head.out == "binary":
        return nnf.binary_cross_entropy_with_logits(y.float(), labels.float())
    return nnf.mse_loss(y.float(), labels.float())
