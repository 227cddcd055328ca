"""The seed reports' task heads. Each reads a list of sides: [y] (one text, or a cross-encoded
pair) or [y1, y2] (a bi-encoded pair), every y already extended with upstream heads' outputs.

Each head's `output` says what it predicts (an Output): a TaskKind, and for the bilinear head one logit s
for two classes, read as the logits [0, s] (softmax([0, s]) = (1 - sigmoid(s), sigmoid(s)), so the engine's
cross-entropy on them is the binary cross-entropy of s).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as nnf
from torch import nn

from adalayers.engine.loss import task_loss
from adalayers.kinds import TaskKind


@dataclass(frozen=True)
class Output:
    """What a head's output y is: class logits (B, n), one logit for two classes (B,), or a value (B,)."""
    kind: TaskKind
    one_logit: bool = False

    def logits(self, y: torch.Tensor) -> torch.Tensor:
        """Class logits (B, n) of a classification output: one logit s reads as [0, s]."""
        return torch.stack([torch.zeros_like(y), y], -1) if self.one_logit else y

    def loss(self, y: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The engine's task loss (adalayers.engine.loss): cross-entropy on the logits, or MSE on the value."""
        if self.kind == TaskKind.REGRESSION:
            return task_loss(self.kind, y, labels)
        return task_loss(self.kind, self.logits(y), labels.long())

    def width(self, n: int) -> int:
        """Width of this output as an extra input downstream."""
        return n if self.kind == TaskKind.CLASSIFICATION and not self.one_logit else 1

    def feature(self, y: torch.Tensor) -> torch.Tensor:
        """The output as a downstream input: class probabilities (B, n), a probability or the value (B, 1)."""
        if self.kind == TaskKind.REGRESSION:
            return y.unsqueeze(-1)
        return torch.sigmoid(y).unsqueeze(-1) if self.one_logit else torch.softmax(y, -1)

    def predictions(self, y: torch.Tensor) -> list:
        """Class indices, or values."""
        return self.logits(y).argmax(-1).tolist() if self.kind == TaskKind.CLASSIFICATION else y.tolist()


CLASSES, ONE_LOGIT, VALUE = Output(TaskKind.CLASSIFICATION), Output(TaskKind.CLASSIFICATION, True), \
    Output(TaskKind.REGRESSION)


class SentimentHead(nn.Module):
    """linear -> GELU -> dropout -> linear."""
    sides, output = 1, CLASSES

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
        self.output = VALUE if regression else CLASSES
        self.dropout, self.linear = nn.Dropout(dropout), nn.Linear(d_in, 1 if regression else n)

    def forward(self, sides):
        y = self.linear(self.dropout(sides[0]))
        return y.squeeze(-1) if self.output == VALUE else y


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
    """Paraphrase: (W1 y1 + b1)^T (W2 y2 + b2), one logit for two classes."""
    output = ONE_LOGIT

    def forward(self, sides):
        u, v = self.project(sides)
        return (u * v).sum(-1) * self.a.out_features ** -0.5  # initial logits near 0; W1, W2 learn any scale


class CosineHead(_PairHead):
    """Similarity: 5 * relu(cos(W1 y1 + b1, W2 y2 + b2)), for MSE against a 0-5 score."""
    output = VALUE

    def forward(self, sides):
        return 5 * torch.relu(nnf.cosine_similarity(*self.project(sides), -1))


def make_head(kind: str, d_in: int, n: int, hidden: int, dropout: float, regression: bool) -> nn.Module:
    if kind == "linear":
        return LinearHead(d_in, n, hidden, dropout, regression)
    return {"sentiment": SentimentHead, "bilinear": BilinearHead, "cosine": CosineHead}[kind](d_in, n, hidden, dropout)
