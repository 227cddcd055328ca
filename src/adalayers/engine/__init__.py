"""One training loop and one prediction loop for everything trainable.

    protocol.py     Trainable: forward(batch) -> logits, loss(out, batch), trainable_parameters()
    loop.py         fit(model, feed, settings, device, ...): precision, schedules, early stopping,
                    resume, the JSONL log, TensorBoard, DDP under torchrun
    predict.py      predict(model, plan, collate, ...): outputs per row, gathered across ranks
    loss.py         the task loss (cross-entropy / MSE)
    checkpoint.py   resume.pt: the full training state after every epoch
    precision.py    fp32 / bf16 / fp16 autocast
    distributed.py  torch.distributed under torchrun (no-ops in one process)
    progress.py     the progress bar and logging setup
"""
from __future__ import annotations

import importlib

_WHERE = {"FitSettings": "loop", "fit": "loop", "trainable_state": "loop", "IGNORE": "loss", "task_loss": "loss",
          "in_order": "predict", "predict": "predict", "probabilities_or_values": "predict",
          "Trainable": "protocol", "count": "protocol", "trainable": "protocol"}
__all__ = list(_WHERE)


def __getattr__(name: str):
    """The names above, imported when first read (PEP 562): `adalayers.engine.progress` alone needs no torch."""
    if name not in _WHERE:
        raise AttributeError(f"module 'adalayers.engine' has no attribute {name!r}")
    return getattr(importlib.import_module(f"adalayers.engine.{_WHERE[name]}"), name)
