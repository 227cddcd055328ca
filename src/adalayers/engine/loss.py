"""The one task loss: cross-entropy for labels (token tasks skip IGNORE positions), MSE for values.

    classification / tokens:  CE(softmax(logits), y), mean over the positions with y != IGNORE
    regression:               mean (out - y)^2
Both are computed in fp32 whatever the autocast precision of the logits.
"""
from __future__ import annotations

import torch
import torch.nn.functional as nnf

from adalayers.kinds import TaskKind

IGNORE = -100  # label of sub-tokens and special tokens in token tasks


def task_loss(kind: TaskKind | str, out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    if kind == TaskKind.REGRESSION:
        return nnf.mse_loss(out.float(), labels.float())
    return nnf.cross_entropy(out.float().reshape(-1, out.shape[-1]), labels.reshape(-1), ignore_index=IGNORE)
