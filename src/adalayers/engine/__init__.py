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
from adalayers.engine.loop import FitSettings, fit, trainable_state
from adalayers.engine.loss import IGNORE, task_loss
from adalayers.engine.predict import in_order, predict, probabilities_or_values
from adalayers.engine.protocol import Trainable, count, trainable

__all__ = ["FitSettings", "fit", "trainable_state", "IGNORE", "task_loss", "in_order", "predict", "probabilities_or_values",
           "Trainable", "count", "trainable"]
