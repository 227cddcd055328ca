"""The one training loop, for everything trainable (adalayers.engine.protocol.Trainable).

Per step: loss = model.loss(model(batch), batch) under the run's precision (fp32, or bf16/fp16
autocast; fp16 with a GradScaler), backward, optional gradient-norm clipping, an AdamW step.
Per epoch: `feed.validate` gives the main validation metric; the learning rate follows the schedule:

    plateau   halve it after `lr_patience` epochs without improvement (ReduceLROnPlateau)
    constant  keep it
    linear    warm up over `warmup_fraction` of all steps, then decay linearly to 0 (per step)

An epoch whose metric beats the best so far is the best epoch (`on_best` saves it; `keep_best`
also holds its trainable tensors in memory and puts them back at the end). Training stops after
`early_stopping` epochs without improvement, after `max_epochs`, or before an epoch that would end
past `max_minutes` (judged by the longest epoch so far). With a run folder, one JSON line per epoch
goes to log.jsonl; with a `config`, the full state goes to resume.pt after every epoch and
`resume` continues from the last completed one exactly as if the run had never stopped (only the
when-to-stop settings, threads, TensorBoard and the tune section may change in between; the stored
config is read through adalayers.config first, so a field added by a newer version is no change).

Under torchrun (adalayers.engine.distributed) the model is wrapped in DistributedDataParallel, each
rank trains on its share of every global batch, the metric is computed from every rank's outputs,
the time limit is rank 0's decision, and rank 0 alone writes files.
"""
from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Protocol

import numpy as np
import torch
from torch import nn

from adalayers.store import checkpoint
from adalayers import config as config_mod
from adalayers.store import run as runlib
from adalayers.engine import distributed
from adalayers.engine.progress import bar
from adalayers.errors import ConfigError, TrainingError
from adalayers.model.precision import autocast_for, precision_of

log = logging.getLogger(__name__)

SCHEDULES = ("plateau", "constant", "linear")
STOPPING = ("max_epochs", "early_stopping", "max_minutes")


@dataclass
class FitSettings:
    lr: float
    max_epochs: int
    weight_decay: float = 0.0
    early_stopping: int | None = None     # epochs without improvement before stopping (None: never)
    grad_clip: float = 0.0                # max gradient norm (0: off)
    precision: str = "fp32"               # auto | fp32 | bf16 | fp16 (adalayers.model.precision)
    seed: int = 0                         # seeds the batch order's generator
    schedule: str = "plateau"
    lr_patience: int = 3
    warmup_fraction: float = 0.1
    max_minutes: float | None = None
    tensorboard: bool = False
    desc: str = ""

    @classmethod
    def of(cls, tc, **changes) -> "FitSettings":
        """From a run config's train section (adalayers.config.TrainConfig)."""
        base = dict(lr=tc.lr, max_epochs=tc.max_epochs, weight_decay=tc.weight_decay,
                    early_stopping=tc.early_stopping, grad_clip=tc.grad_clip, precision=tc.precision,
                    seed=tc.seed, lr_patience=tc.lr_patience, max_minutes=tc.max_minutes,
                    tensorboard=tc.tensorboard)
        return cls(**{**base, **changes})


class Feed(Protocol):
    """The data side of training: this rank's batches of an epoch, and the validation score."""
    steps: int  # batches per epoch

    def epoch(self, epoch: int, generator: torch.Generator) -> Iterable[dict]: ...

    def validate(self, epoch: int) -> tuple[float, dict]:
        """(main metric, fields for the epoch's log line, e.g. {"validation": {...}})"""
        ...


@dataclass
class Progress:
    """Early-stopping bookkeeping; saved with every checkpoint."""
    best: float = -math.inf
    best_epoch: int = 0
    bad_epochs: int = 0
    step: int = 0


class _Step(nn.Module):
    """forward(batch) -> the (weighted) loss: what DistributedDataParallel wraps, so that every
    parameter the loss reads (e.g. an entropy penalty on the layer weights) is seen by its hooks."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, batch: dict) -> torch.Tensor:
        loss = self.model.loss(self.model(batch), batch)
        weight = batch.get("loss_weight")
        return loss if weight is None else loss * weight


def schedule(opt, s: FitSettings, total_steps: int):
    if s.schedule == "plateau":
        return torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", factor=0.5, patience=s.lr_patience)
    if s.schedule == "constant":
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0)
    if s.schedule == "linear":
        warm = max(1, int(s.warmup_fraction * total_steps))
        return torch.optim.lr_scheduler.LambdaLR(
            opt, lambda i: (i + 1) / warm if i < warm else max(0.0, (total_steps - i) / max(1, total_steps - warm)))
    raise ConfigError(f"schedule: must be one of {', '.join(SCHEDULES)}, got {s.schedule!r}")


def adamw(groups: list[dict], s: FitSettings, device: torch.device) -> torch.optim.AdamW:
    """AdamW, with torch's fused kernel on a CPU or CUDA device: one pass over all parameters instead of
    a dozen element-wise ops per tensor (the same update; the for-loop version was a visible part of a
    cached token-head step)."""
    fused = device.type in ("cpu", "cuda") and all(p.is_floating_point() for g in groups for p in g["params"])
    return torch.optim.AdamW(groups, lr=s.lr, weight_decay=s.weight_decay, fused=fused or None)


def time_left(epoch_seconds: list[float], epochs_left: int) -> str:
    """'  ~3m20s left at most': the median epoch so far times the epochs left (early stopping may end
    training sooner), or '' when none are left. The first epoch counts only while it is the only one: it
    also builds the hidden-state cache, so it can take many times a later epoch."""
    if epochs_left <= 0 or not epoch_seconds:
        return ""
    left = round(float(np.median(epoch_seconds[1:] or epoch_seconds)) * epochs_left)
    shown = f"{left // 3600}h{left % 3600 // 60:02d}m" if left >= 3600 else f"{left // 60}m{left % 60:02d}s"
    return f"  ~{shown} left at most"


def trainable_state(model: nn.Module) -> dict:
    """The tensors training changes (what a best epoch is)."""
    return {k: v for k, v in model.named_parameters() if v.requires_grad}


# what a resumed run may change: when to stop, how many threads, TensorBoard, and the tuner's section
RESUME_FREE = {"train": {*STOPPING, "num_threads", "tensorboard"}, "tune": None}


def resume_differences(stored: dict, config: dict) -> list[str]:
    """The settings a resumed run would change that decide what it learns (adalayers.config.differences:
    the stored config is read by this version first, so a field added since is no difference)."""
    return config_mod.differences(stored, config, RESUME_FREE)


def _keep_log_lines(log_path: Path, epochs: int) -> None:
    """Drop log lines of an epoch that was interrupted before its checkpoint."""
    if log_path.is_file():
        lines = log_path.read_text(encoding="utf-8").splitlines()[:epochs]
        runlib.atomic_write(log_path, "".join(line + "\n" for line in lines))


def fit(model: nn.Module, feed: Feed, s: FitSettings, device: torch.device, *, run_dir: Path | None = None,
        config: dict | None = None, resume: bool = False, on_best: Callable[[int], None] | None = None,
        keep_best: bool = False, on_epoch: Callable[[int, float], None] | None = None) -> dict:
    """Train `model` on `feed`; returns best_epoch, best_validation, epochs, train_seconds and the log.

    on_best(epoch) runs on rank 0 when an epoch is the best so far (save it); on_epoch(epoch, metric)
    after every epoch's checkpoint (an exception it raises ends training, e.g. a tuner's pruning).
    """
    main = distributed.is_main()
    run_dir = Path(run_dir) if run_dir is not None else None
    model.to(device)
    params = list(model.trainable_parameters())
    if not params:
        raise TrainingError(f"{s.desc or 'model'}: nothing to train (no parameter requires grad)")
    groups = model.param_groups() if hasattr(model, "param_groups") else [{"params": params}]
    opt = adamw(groups, s, device)
    sched = schedule(opt, s, feed.steps * s.max_epochs)
    autocast = autocast_for(s.precision, device)
    scaler = torch.amp.GradScaler("cuda", enabled=autocast is not None and precision_of(s.precision, device) == "fp16")
    gen = torch.Generator().manual_seed(s.seed)
    step_model = distributed.wrap(_Step(model), device)
    progress, start, elapsed, history = Progress(), 1, 0.0, []
    log_path = run_dir / "log.jsonl" if run_dir is not None else None
    state = checkpoint.load(run_dir) if resume and run_dir is not None else None
    if state is not None:
        diffs = resume_differences(state["config"], config) if config is not None else []
        if diffs:
            raise TrainingError(f"{run_dir} holds an unfinished run with a different config ({'; '.join(diffs)}; "
                                f"only train.max_epochs, early_stopping, max_minutes, num_threads, tensorboard "
                                f"and the tune section may change on resume); use another --out or delete "
                                f"{run_dir / checkpoint.NAME}")
        checkpoint.restore(state, model, opt, sched, scaler, gen, distributed.rank())
        progress = Progress(**state["progress"])
        start, elapsed = state["epoch"] + 1, state["elapsed"]
        distributed.barrier()  # every rank has read the log's length before rank 0 trims it
        if main:
            _keep_log_lines(log_path, state["epoch"])
        log.info("resuming %s after epoch %d (best %.4f at epoch %d)", run_dir, state["epoch"], progress.best,
                 progress.best_epoch)
        if s.early_stopping is not None and progress.bad_epochs >= s.early_stopping:
            start = s.max_epochs + 1
    elif log_path is not None and main:
        log_path.unlink(missing_ok=True)
    board = None
    if s.tensorboard and run_dir is not None and main:
        from adalayers.engine.board import Board
        board = Board(run_dir)
    best_state = None
    t_start = time.perf_counter() - elapsed
    epoch, longest, times = start - 1, 0.0, []
    name = f"{s.desc} " if s.desc else ""
    try:
        for epoch in range(start, s.max_epochs + 1):
            t0 = time.perf_counter()
            model.train()
            losses = []
            for batch in bar(feed.epoch(epoch, gen), feed.steps, f"{name}epoch {epoch}/{s.max_epochs}"):
                progress.step += 1
                with autocast() if autocast else contextlib.nullcontext():
                    loss = step_model(batch)
                if not torch.isfinite(loss).all():
                    where = ("" if run_dir is None else " No checkpoint was written (no epoch had finished)"
                             if not progress.best_epoch else
                             f" The best checkpoint so far (epoch {progress.best_epoch}) stays in {run_dir}")
                    raise TrainingError(f"{name}the loss became {loss.sum().item()} at step {progress.step} "
                                        f"(epoch {epoch}); stopped.{where}")
                opt.zero_grad(set_to_none=True)
                scaled = scaler.scale(loss)
                if hasattr(model, "backward"):
                    model.backward(scaled)
                else:
                    scaled.backward()
                if s.grad_clip:
                    scaler.unscale_(opt)
                    torch.nn.utils.clip_grad_norm_(params, s.grad_clip)
                scaler.step(opt)
                scaler.update()
                if s.schedule != "plateau":
                    sched.step()
                if hasattr(model, "after_step"):
                    model.after_step()
                losses.append(loss.sum().item())
            train_loss = float(np.mean(distributed.gather(float(np.mean(losses)) if losses else math.nan)))
            metric, fields = feed.validate(epoch)
            if s.schedule == "plateau":
                sched.step(metric)
            improved = metric > progress.best
            if improved:
                progress.best, progress.best_epoch, progress.bad_epochs = metric, epoch, 0
                if keep_best:
                    best_state = {k: v.detach().clone() for k, v in trainable_state(model).items()}
                if on_best is not None and main:
                    on_best(epoch)
            else:
                progress.bad_epochs += 1
            entry = {"epoch": epoch, "train_loss": train_loss, **fields, "lr": opt.param_groups[0]["lr"],
                     "seconds": round(time.perf_counter() - t0, 3),
                     **(model.log_extra() if hasattr(model, "log_extra") else {}), "best": improved}
            entry.update(fields)  # a feed may give its own train_loss (the multi-task model: per task)
            history.append(entry)
            rngs = distributed.gather(checkpoint.rng_state()) if config is not None else None
            if main and log_path is not None:
                runlib.append_jsonl(log_path, entry)
                if config is not None:
                    checkpoint.save(run_dir, epoch=epoch, model=model, opt=opt, sched=sched, scaler=scaler,
                                    gen=gen, progress=asdict(progress), elapsed=time.perf_counter() - t_start,
                                    config=config, rngs=rngs)
            if board is not None:
                board.epoch(entry)
            if on_epoch is not None:
                on_epoch(epoch, metric)
            shown = f"{metric:.4f}"
            times.append(entry["seconds"])
            log.info("%sepoch %3d/%d  loss %.4f  val %s%s  lr %.2e  %.1fs%s", name, epoch, s.max_epochs, train_loss,
                     shown, "  *" if improved else "", entry["lr"], entry["seconds"],
                     time_left(times, s.max_epochs - epoch))
            longest, spent = max(longest, time.perf_counter() - t0), time.perf_counter() - t_start
            if s.early_stopping is not None and progress.bad_epochs >= s.early_stopping:
                log.info("early stop: no validation improvement for %d epochs", progress.bad_epochs)
                break
            over = s.max_minutes is not None and epoch < s.max_epochs and spent + longest > s.max_minutes * 60
            if distributed.broadcast(over):
                log.info("time limit: another epoch would end past train.max_minutes=%s (%.0f s spent, the "
                         "longest epoch took %.0f s)", s.max_minutes, spent, longest)
                break
    except KeyboardInterrupt:
        if run_dir is not None and config is not None:
            log.warning("interrupted in epoch %d; to continue after the last completed epoch, run the same "
                        "command with --resume (run folder %s)", epoch, run_dir)
        raise
    finally:
        if board is not None:
            board.close()
    distributed.barrier()  # rank 0's files are complete before any rank reads them
    if keep_best and best_state is not None:
        model.load_state_dict(best_state, strict=False)
    return {"best_epoch": progress.best_epoch, "best_validation": progress.best, "epochs": epoch,
            "train_seconds": round(time.perf_counter() - t_start, 2), "history": history}
