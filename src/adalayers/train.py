"""The training recipe.

AdamW; the learning rate halves after `lr_patience` epochs without validation improvement;
training stops after `early_stopping` such epochs, after `max_epochs`, or before an epoch that
would overrun `max_minutes`; the run folder keeps the best epoch on the task's main validation
metric. One JSON line per epoch. An optional `on_epoch(epoch, validation_metric)` callback runs
after each epoch's checkpoint (the tuner's pruner listens there); an exception it raises ends training.
"""
from __future__ import annotations

import contextlib
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import torch
from tqdm.auto import tqdm

from adalayers import checkpoint
from adalayers import run as runlib
from adalayers.encoding import batches
from adalayers.errors import AdaLayersError
from adalayers.evaluate import evaluate_split
from adalayers.precision import autocast_for


class TrainingError(AdaLayersError):
    """Training cannot go on (e.g. the loss became NaN); the last good checkpoint is kept."""


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise TrainingError("train.device=cuda but no CUDA device is available")
    return torch.device(name)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


@dataclass
class Progress:
    """Early-stopping bookkeeping; saved with every checkpoint."""
    best: float = -math.inf
    best_epoch: int = 0
    bad_epochs: int = 0
    step: int = 0


@dataclass
class Loop:
    """What one epoch needs besides the data: the optimiser side of training."""
    opt: torch.optim.Optimizer
    sched: torch.optim.lr_scheduler.ReduceLROnPlateau
    scaler: torch.amp.GradScaler
    gen: torch.Generator
    params: list
    autocast: object


EpochCallback = Callable[[int, float], None]


def fit(task, source, data, encoded: dict, cfg, run_dir: Path, backbone, pad_id: int, resume: bool = False,
        on_epoch: EpochCallback | None = None) -> dict:
    """Train `task` on encoded["train"], selecting the best epoch on encoded["validation"].

    After each epoch the full training state goes to resume.pt; with `resume`, training continues
    from the last completed epoch exactly as if it had never stopped.
    """
    run_dir, tc = Path(run_dir), cfg.train
    task.to(backbone.device)
    autocast = autocast_for(tc.precision, backbone.device)
    params = [p for p in task.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=tc.lr, weight_decay=tc.weight_decay)
    loop = Loop(opt, torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", factor=0.5, patience=tc.lr_patience),
                torch.amp.GradScaler("cuda", enabled=autocast is not None and tc.precision == "fp16"),
                torch.Generator().manual_seed(tc.seed), params, autocast)
    progress, start, elapsed = Progress(), 1, 0.0
    log_path = run_dir / "log.jsonl"
    state = checkpoint.load(run_dir) if resume else None
    if state is not None:
        if _without_stopping(state["config"]) != _without_stopping(cfg.to_dict()):
            raise TrainingError(f"{run_dir} holds an unfinished run with a different config (only "
                                f"train.max_epochs, early_stopping and max_minutes may change on resume); "
                                f"use another --out or delete {run_dir / checkpoint.NAME}")
        checkpoint.restore(state, task, loop.opt, loop.sched, loop.scaler, loop.gen)
        progress = Progress(**state["progress"])
        start, elapsed = state["epoch"] + 1, state["elapsed"]
        _keep_log_lines(log_path, state["epoch"])
        tqdm.write(f"resuming {run_dir} after epoch {state['epoch']} "
                   f"(best {data.main_metric} {progress.best:.4f} at epoch {progress.best_epoch})")
        if progress.bad_epochs >= tc.early_stopping:
            start = tc.max_epochs + 1
    else:
        log_path.unlink(missing_ok=True)
    t_start = time.perf_counter() - elapsed
    epoch, longest = start - 1, 0.0
    try:
        for epoch in range(start, tc.max_epochs + 1):
            t_epoch = time.perf_counter()
            metric = _epoch(epoch, task, source, data, encoded, cfg, run_dir, backbone, pad_id, loop, progress)
            checkpoint.save(run_dir, epoch=epoch, task=task, loop=loop, progress=asdict(progress),
                            elapsed=time.perf_counter() - t_start, config=cfg.to_dict())
            if on_epoch is not None:
                on_epoch(epoch, metric)
            longest, spent = max(longest, time.perf_counter() - t_epoch), time.perf_counter() - t_start
            if progress.bad_epochs >= tc.early_stopping:
                tqdm.write(f"early stop: no validation improvement for {progress.bad_epochs} epochs")
                break
            if tc.max_minutes is not None and epoch < tc.max_epochs and spent + longest > tc.max_minutes * 60:
                tqdm.write(f"time limit: another epoch would end past train.max_minutes={tc.max_minutes} "
                           f"({spent:.0f} s spent, the longest epoch took {longest:.0f} s)")
                break
    except KeyboardInterrupt:
        tqdm.write(f"interrupted in epoch {epoch}; to continue after the last completed epoch, run the same "
                   f"command with --resume (run folder {run_dir})")
        raise
    return {"best_epoch": progress.best_epoch, "best_validation": progress.best, "epochs": epoch,
            "train_seconds": round(time.perf_counter() - t_start, 2)}


STOPPING = ("max_epochs", "early_stopping", "max_minutes")


def _without_stopping(config: dict) -> dict:
    """The config minus when-to-stop settings: a resumed run may be given more or fewer epochs."""
    return {**config, "train": {k: v for k, v in config["train"].items() if k not in STOPPING}}


def _keep_log_lines(log_path: Path, epochs: int) -> None:
    """Drop log lines of an epoch that was interrupted before its checkpoint."""
    if log_path.is_file():
        lines = log_path.read_text(encoding="utf-8").splitlines()[:epochs]
        runlib.atomic_write(log_path, "".join(line + "\n" for line in lines))


def _epoch(epoch, task, source, data, encoded, cfg, run_dir, backbone, pad_id, loop: Loop, progress: Progress):
    tc, device = cfg.train, backbone.device
    t0 = time.perf_counter()
    task.train()
    losses = []
    bar = tqdm(batches(encoded["train"], tc.batch_size, pad_id, shuffle=True, generator=loop.gen),
               total=math.ceil(len(encoded["train"].rows) / tc.batch_size), desc=f"epoch {epoch}",
               leave=False, dynamic_ncols=True)
    for batch in bar:
        progress.step += 1
        with loop.autocast() if loop.autocast else contextlib.nullcontext():
            source.run(batch, [task])
            logits = task.end(batch["attention_mask"])
            loss = task.loss(logits, batch["labels"].to(device))
        if not torch.isfinite(loss):
            raise TrainingError(f"the loss became {loss.item()} at step {progress.step} (epoch {epoch}); "
                                f"stopped. The best checkpoint so far (epoch {progress.best_epoch}) stays in "
                                f"{run_dir}")
        loop.opt.zero_grad(set_to_none=True)
        loop.scaler.scale(loss).backward()
        if tc.grad_clip:
            loop.scaler.unscale_(loop.opt)
            torch.nn.utils.clip_grad_norm_(loop.params, tc.grad_clip)
        loop.scaler.step(loop.opt)
        loop.scaler.update()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}")
    val, _ = evaluate_split(task, source, encoded["validation"], data.splits["validation"],
                            tc.eval_batch_size, pad_id, loop.autocast)
    metric = val[data.main_metric]
    loop.sched.step(metric)
    improved = metric > progress.best
    if improved:
        progress.best, progress.best_epoch, progress.bad_epochs = metric, epoch, 0
        sha = runlib.save_head(run_dir, task)
        runlib.save_config(run_dir, cfg, data.labels, backbone, sha, task=data.name, kind=data.kind,
                           main_metric=data.main_metric)
    else:
        progress.bad_epochs += 1
    entry = {"epoch": epoch, "train_loss": float(np.mean(losses)), "validation": _flat(val),
             "lr": loop.opt.param_groups[0]["lr"], "seconds": round(time.perf_counter() - t0, 3),
             "layer_weights": [round(x, 6) for x in task.mixer.layer_weights().tolist()], "best": improved}
    runlib.append_jsonl(run_dir / "log.jsonl", entry)
    tqdm.write(f"epoch {epoch:3d}  loss {entry['train_loss']:.4f}  val {data.main_metric} {metric:.4f}"
               f"{'  *' if improved else ''}  lr {entry['lr']:.2e}  {entry['seconds']:.1f}s")
    return metric


def _flat(m: dict) -> dict:
    return {k: v for k, v in m.items() if not isinstance(v, dict)}
