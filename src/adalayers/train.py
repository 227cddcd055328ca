"""The training recipe.

AdamW; the learning rate halves after `lr_patience` epochs without validation improvement;
training stops after `early_stopping` such epochs or `max_epochs`; the best epoch on the
task's main validation metric is what the run folder keeps. One JSON line per epoch.
"""
from __future__ import annotations

import contextlib
import math
import random
import time
from pathlib import Path

import numpy as np
import torch
from tqdm.auto import tqdm

from adalayers import run as runlib
from adalayers.encoding import batches
from adalayers.errors import AdaLayersError
from adalayers.evaluate import evaluate_split


class TrainingError(AdaLayersError):
    """Training cannot go on (e.g. the loss became NaN); the last good checkpoint is kept."""


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise TrainingError("train.device=cuda but no CUDA device is available")
    return torch.device(name)


def autocast_for(precision: str, device: torch.device):
    """A context factory: bf16 autocast on CUDA by default, fp32 on CPU."""
    if device.type != "cuda" or precision == "fp32" or (precision == "auto" and device.type != "cuda"):
        return None
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    return lambda: torch.autocast("cuda", dtype=dtype)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def fit(task, source, data, encoded: dict, cfg, run_dir: Path, backbone, pad_id: int) -> dict:
    """Train `task` on encoded["train"], select on encoded["validation"], score encoded["test"]."""
    run_dir = Path(run_dir)
    tc = cfg.train
    device = backbone.device
    task.to(device)
    autocast = autocast_for(tc.precision, device)
    scaler = torch.amp.GradScaler("cuda", enabled=autocast is not None and tc.precision == "fp16")
    params = [p for p in task.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=tc.lr, weight_decay=tc.weight_decay)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="max", factor=0.5, patience=tc.lr_patience)
    gen = torch.Generator().manual_seed(tc.seed)
    log_path = run_dir / "log.jsonl"
    log_path.unlink(missing_ok=True)
    best, best_epoch, bad_epochs, step = -math.inf, 0, 0, 0
    t_start = time.perf_counter()
    for epoch in range(1, tc.max_epochs + 1):
        t0 = time.perf_counter()
        task.train()
        losses = []
        n_batches = math.ceil(len(encoded["train"].rows) / tc.batch_size)
        bar = tqdm(batches(encoded["train"], tc.batch_size, pad_id, shuffle=True, generator=gen),
                   total=n_batches, desc=f"epoch {epoch}", leave=False, dynamic_ncols=True)
        for batch in bar:
            step += 1
            with autocast() if autocast else contextlib.nullcontext():
                source.run(batch, [task])
                logits = task.end(batch["attention_mask"])
                loss = task.loss(logits, batch["labels"].to(device))
            if not torch.isfinite(loss):
                raise TrainingError(f"the loss became {loss.item()} at step {step} (epoch {epoch}); "
                                    f"the last good checkpoint (epoch {best_epoch}) is kept in {run_dir}")
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            if tc.grad_clip:
                scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(params, tc.grad_clip)
            scaler.step(opt)
            scaler.update()
            losses.append(loss.item())
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}")
        val, _ = evaluate_split(task, source, encoded["validation"], data.splits["validation"],
                                tc.eval_batch_size, pad_id, autocast)
        metric = val[data.main_metric]
        sched.step(metric)
        improved = metric > best
        if improved:
            best, best_epoch, bad_epochs = metric, epoch, 0
            sha = runlib.save_head(run_dir, task)
            runlib.save_config(run_dir, cfg, data.labels, backbone, sha, task=data.name, kind=data.kind,
                               main_metric=data.main_metric)
        else:
            bad_epochs += 1
        entry = {"epoch": epoch, "train_loss": float(np.mean(losses)), "validation": _flat(val),
                 "lr": opt.param_groups[0]["lr"], "seconds": round(time.perf_counter() - t0, 3),
                 "layer_weights": [round(x, 6) for x in task.mixer.layer_weights().tolist()],
                 "best": improved}
        runlib.append_jsonl(log_path, entry)
        tqdm.write(f"epoch {epoch:3d}  loss {entry['train_loss']:.4f}  val {data.main_metric} {metric:.4f}"
                   f"{'  *' if improved else ''}  lr {entry['lr']:.2e}  {entry['seconds']:.1f}s")
        if bad_epochs >= tc.early_stopping:
            tqdm.write(f"early stop: no validation improvement for {bad_epochs} epochs")
            break
    return {"best_epoch": best_epoch, "best_validation": best, "epochs": epoch,
            "train_seconds": round(time.perf_counter() - t_start, 2)}


def _flat(m: dict) -> dict:
    return {k: v for k, v in m.items() if not isinstance(v, dict)}
