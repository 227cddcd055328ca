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
goes to log.jsonl; with a `resume_key` (what a resumed run must agree on, e.g. the run's config), the
full state goes to resume.pt (adalayers.engine.checkpoint) after every epoch and `resume` continues from
the last completed one exactly as if the run had never stopped; the caller's `differences` says which
changes it refuses (adalayers.recipes.train: only when-to-stop settings, threads, TensorBoard and the
tune section may change).

Under torchrun (adalayers.engine.distributed) the model is wrapped in DistributedDataParallel, each
rank trains on its share of every global batch, the metric is computed from every rank's outputs,
the time limit is rank 0's decision, and rank 0 alone writes files.
"""
from __future__ import annotations

import contextlib
import logging
import math
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable, Iterable, Protocol

import numpy as np
import torch
from torch import nn

from adalayers.engine import checkpoint, distributed
from adalayers.engine.precision import autocast_for, precision_of
from adalayers.engine.progress import bar
from adalayers.errors import ConfigError, TrainingError
from adalayers.files import append_jsonl, atomic_write

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
    precision: str = "fp32"               # auto | fp32 | bf16 | fp16 (adalayers.engine.precision)
    seed: int = 0                         # seeds the batch order's generator
    schedule: str = "plateau"
    lr_patience: int = 3
    warmup_fraction: float = 0.1
    max_minutes: float | None = None
    tensorboard: bool = False
    desc: str = ""

    @classmethod
    def of(cls, section, **changes) -> "FitSettings":
        """From any settings object (e.g. a run config's train section): each FitSettings field it has under
        the same name, then `changes`."""
        return cls(**{**{f.name: getattr(section, f.name) for f in fields(cls) if hasattr(section, f.name)},
                      **changes})


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


def time_left(epoch_seconds: list[float], epochs_left: int, cap: float | None = None) -> str:
    """'  ~3m20s left at most': the median epoch so far times the epochs left (early stopping may end
    training sooner), at most `cap` seconds (what train.max_minutes leaves), or '' when none are left. The
    first epoch counts only while it is the only one: it can take longer than the later ones (fit gives each
    epoch's training at the pace of its second half, which leaves most of that out)."""
    if epochs_left <= 0 or not epoch_seconds:
        return ""
    left = round(float(np.median(epoch_seconds[1:] or epoch_seconds)) * epochs_left)
    left = left if cap is None else max(0, min(left, round(cap)))
    shown = f"{left // 3600}h{left % 3600 // 60:02d}m" if left >= 3600 else f"{left // 60}m{left % 60:02d}s"
    return f"  ~{shown} left at most"


def trainable_state(model: nn.Module) -> dict:
    """The tensors training changes (what a best epoch is)."""
    return {k: v for k, v in model.named_parameters() if v.requires_grad}


def _keep_log_lines(log_path: Path, epochs: int) -> None:
    """Drop log lines of an epoch that was interrupted before its checkpoint."""
    if log_path.is_file():
        lines = log_path.read_text(encoding="utf-8").splitlines()[:epochs]
        atomic_write(log_path, "".join(line + "\n" for line in lines))


class _Fit:
    """One call of fit: the optimiser, schedule, precision, batch-order generator and early-stopping
    bookkeeping of a model, and the parts of an epoch (steps, validation, log line, checkpoint)."""

    def __init__(self, model: nn.Module, feed: Feed, s: FitSettings, device: torch.device, run_dir: Path | None,
                 resume_key: dict | None):
        self.model, self.feed, self.s, self.run_dir, self.resume_key = model, feed, s, run_dir, resume_key
        self.main = distributed.is_main()
        model.to(device)
        self.params = list(model.trainable_parameters())
        if not self.params:
            raise TrainingError(f"{s.desc or 'model'}: nothing to train (no parameter requires grad)")
        groups = model.param_groups() if hasattr(model, "param_groups") else [{"params": self.params}]
        self.opt = adamw(groups, s, device)
        self.sched = schedule(self.opt, s, feed.steps * s.max_epochs)
        self.autocast = autocast_for(s.precision, device)
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.autocast is not None
                                           and precision_of(s.precision, device) == "fp16")
        self.gen = torch.Generator().manual_seed(s.seed)
        self.step_model = distributed.wrap(_Step(model), device)
        self.progress, self.start, self.elapsed, self.history = Progress(), 1, 0.0, []
        self.pace = 0.0  # the last epoch's training seconds at the pace of its second half (train_epoch)
        self.log_path = run_dir / "log.jsonl" if run_dir is not None else None
        self.name = f"{s.desc} " if s.desc else ""
        self.best_state, self.board = None, None

    def resume(self, differences: Callable[[dict, dict], list[str]] | None) -> bool:
        """Continue after the last completed epoch of run_dir's resume state; False when there is none."""
        state = checkpoint.load(self.run_dir)
        if state is None:
            return False
        if self.resume_key is not None:
            diffs = (differences or _plain_differences)(state["config"], self.resume_key)
            if diffs:
                raise TrainingError(f"{self.run_dir} holds an unfinished run with different settings "
                                    f"({'; '.join(diffs)}); use another --out or delete {self.run_dir / checkpoint.NAME}")
        checkpoint.restore(state, self.model, self.opt, self.sched, self.scaler, self.gen, distributed.rank())
        self.progress = Progress(**state["progress"])
        self.start, self.elapsed = state["epoch"] + 1, state["elapsed"]
        distributed.barrier()  # every rank has read the log's length before rank 0 trims it
        if self.main:
            _keep_log_lines(self.log_path, state["epoch"])
        log.info("resuming %s after epoch %d (best %.4f at epoch %d)", self.run_dir, state["epoch"],
                 self.progress.best, self.progress.best_epoch)
        if self.s.early_stopping is not None and self.progress.bad_epochs >= self.s.early_stopping:
            self.start = self.s.max_epochs + 1
        return True

    def train_epoch(self, epoch: int) -> float:
        """One pass over the feed's batches; the mean training loss over every rank. Sets `pace`: the seconds the
        pass would take at the pace of its second half, which the time left is estimated from (a run's first
        batches are slower: memory first allocated, a state cache read from disk for the first time)."""
        self.model.train()
        losses, marks = [], [time.perf_counter()]
        for batch in bar(self.feed.epoch(epoch, self.gen), self.feed.steps,
                         f"{self.name}epoch {epoch}/{self.s.max_epochs}"):
            losses.append(self.step(batch, epoch))
            marks.append(time.perf_counter())
        n, half = len(losses), len(losses) // 2
        self.pace = marks[-1] - marks[0] if half == 0 else (marks[-1] - marks[half]) * n / (n - half)
        return float(np.mean(distributed.gather(float(np.mean(losses)) if losses else math.nan)))

    def step(self, batch: dict, epoch: int) -> float:
        """loss, backward (scaled for fp16), clipping, the AdamW step, a per-step schedule; the loss."""
        model, opt, scaler, progress = self.model, self.opt, self.scaler, self.progress
        progress.step += 1
        with self.autocast() if self.autocast else contextlib.nullcontext():
            loss = self.step_model(batch)
        if not torch.isfinite(loss).all():
            where = ("" if self.run_dir is None else " No checkpoint was written (no epoch had finished)"
                     if not progress.best_epoch else
                     f" The best checkpoint so far (epoch {progress.best_epoch}) stays in {self.run_dir}")
            raise TrainingError(f"{self.name}the loss became {loss.sum().item()} at step {progress.step} "
                                f"(epoch {epoch}); stopped.{where}")
        opt.zero_grad(set_to_none=True)
        scaled = scaler.scale(loss)
        if hasattr(model, "backward"):
            model.backward(scaled)
        else:
            scaled.backward()
        if self.s.grad_clip:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(self.params, self.s.grad_clip)
        scaler.step(opt)
        scaler.update()
        if self.s.schedule != "plateau":
            self.sched.step()
        if hasattr(model, "after_step"):
            model.after_step()
        return loss.sum().item()

    def judge(self, epoch: int, metric: float, keep_best: bool, on_best: Callable[[int], None] | None) -> bool:
        """Early-stopping bookkeeping for the epoch's validation metric; True when it is the best so far."""
        if self.s.schedule == "plateau":
            self.sched.step(metric)
        if not metric > self.progress.best:  # NaN is no improvement
            self.progress.bad_epochs += 1
            return False
        self.progress.best, self.progress.best_epoch, self.progress.bad_epochs = metric, epoch, 0
        if keep_best:
            self.best_state = {k: v.detach().clone() for k, v in trainable_state(self.model).items()}
        if on_best is not None and self.main:
            on_best(epoch)
        return True

    def record(self, entry: dict, t_start: float) -> None:
        """The epoch's log line (log.jsonl, TensorBoard) and, with a resume key, its resume state."""
        self.history.append(entry)
        rngs = distributed.gather(checkpoint.rng_state()) if self.resume_key is not None else None
        if self.main and self.log_path is not None:
            append_jsonl(self.log_path, entry)
            if self.resume_key is not None:
                checkpoint.save(self.run_dir, epoch=entry["epoch"], model=self.model, opt=self.opt,
                                sched=self.sched, scaler=self.scaler, gen=self.gen, progress=asdict(self.progress),
                                elapsed=time.perf_counter() - t_start, config=self.resume_key, rngs=rngs)
        if self.board is not None:
            self.board.epoch(entry)

    def should_stop(self, epoch: int, spent: float, longest: float) -> bool:
        """Early stopping, or an epoch that would end past max_minutes (rank 0 decides)."""
        s = self.s
        if s.early_stopping is not None and self.progress.bad_epochs >= s.early_stopping:
            log.info("early stop: no validation improvement for %d epochs", self.progress.bad_epochs)
            return True
        over = s.max_minutes is not None and epoch < s.max_epochs and spent + longest > s.max_minutes * 60
        if distributed.broadcast(over):
            log.info("time limit: another epoch would end past train.max_minutes=%s (%.0f s spent, the "
                     "longest epoch took %.0f s)", s.max_minutes, spent, longest)
            return True
        return False


def _plain_differences(stored: dict, now: dict) -> list[str]:
    """The top-level keys two resume keys disagree on (a caller with nested settings passes its own)."""
    return [f"{k}: {stored.get(k)!r} there, {now.get(k)!r} now" for k in sorted(set(stored) | set(now))
            if stored.get(k) != now.get(k)]


def fit(model: nn.Module, feed: Feed, s: FitSettings, device: torch.device, *, run_dir: Path | None = None,
        resume_key: dict | None = None, differences: Callable[[dict, dict], list[str]] | None = None,
        resume: bool = False, on_best: Callable[[int], None] | None = None, keep_best: bool = False,
        on_epoch: Callable[[int, float], None] | None = None) -> dict:
    """Train `model` on `feed`; returns best_epoch, best_validation, epochs, train_seconds and the log.

    resume_key: what a resumed run must agree on (e.g. the run's config as a dict); with it and a run_dir,
    the full state goes to resume.pt after every epoch, and `resume` continues from there when
    differences(stored_key, resume_key) is empty (default: the top-level keys that differ).
    on_best(epoch) runs on rank 0 when an epoch is the best so far (save it); on_epoch(epoch, metric)
    after every epoch's checkpoint (an exception it raises ends training, e.g. a tuner's pruning).
    """
    run_dir = Path(run_dir) if run_dir is not None else None
    f = _Fit(model, feed, s, device, run_dir, resume_key)
    resumed = resume and run_dir is not None and f.resume(differences)
    if not resumed and f.log_path is not None and f.main:
        f.log_path.unlink(missing_ok=True)
    if s.tensorboard and run_dir is not None and f.main:
        from adalayers.engine.board import Board
        f.board = Board(run_dir)
    t_start = time.perf_counter() - f.elapsed
    epoch, longest, times = f.start - 1, 0.0, []
    try:
        for epoch in range(f.start, s.max_epochs + 1):
            t0 = time.perf_counter()
            train_loss = f.train_epoch(epoch)
            trained = time.perf_counter() - t0
            metric, extra = feed.validate(epoch)
            improved = f.judge(epoch, metric, keep_best, on_best)
            entry = {"epoch": epoch, "train_loss": train_loss, **extra, "lr": f.opt.param_groups[0]["lr"],
                     "seconds": round(time.perf_counter() - t0, 3),
                     **(model.log_extra() if hasattr(model, "log_extra") else {}), "best": improved}
            entry.update(extra)  # a feed may give its own train_loss (the multi-task model: per task)
            f.record(entry, t_start)
            if on_epoch is not None:
                on_epoch(epoch, metric)
            times.append(entry["seconds"] - trained + f.pace)  # the epoch at its training's second-half pace
            log.info("%sepoch %3d/%d  loss %.4f  val %.4f%s  lr %.2e  %.1fs%s", f.name, epoch, s.max_epochs,
                     train_loss, metric, "  *" if improved else "", entry["lr"], entry["seconds"],
                     time_left(times, s.max_epochs - epoch, None if s.max_minutes is None
                               else s.max_minutes * 60 - (time.perf_counter() - t_start)))
            longest = max(longest, time.perf_counter() - t0)
            if f.should_stop(epoch, time.perf_counter() - t_start, longest):
                break
    except KeyboardInterrupt:
        if run_dir is not None and resume_key is not None:
            log.warning("interrupted in epoch %d; to continue after the last completed epoch, run the same "
                        "command with --resume (run folder %s)", epoch, run_dir)
        raise
    finally:
        if f.board is not None:
            f.board.close()
    distributed.barrier()  # rank 0's files are complete before any rank reads them
    if keep_best and f.best_state is not None:
        model.load_state_dict(f.best_state, strict=False)
    return {"best_epoch": f.progress.best_epoch, "best_validation": f.progress.best, "epochs": epoch,
            "train_seconds": round(time.perf_counter() - t_start, 2), "history": f.history}
