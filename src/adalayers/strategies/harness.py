"""The generic trainer every non-AdaLayers strategy goes through.

A strategy hands it a `StrategyModel`: an nn.Module whose trainable parameters are the ones
with requires_grad, a `forward(batch) -> logits`, a `loss(logits, labels)` and `infer(batch, n)`
(run n copies of the side task on one batch, for timing). The trainer knows nothing else about it.

AdamW, a constant or linear-warmup-then-decay learning rate, selection of the best epoch on the
task's main validation metric (its trainable tensors are kept in memory), early stopping after
`train.early_stopping` epochs without improvement. Scoring reuses adalayers.evaluate.
"""
from __future__ import annotations

import contextlib
import copy
import hashlib
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as nnf
from torch import nn
from tqdm.auto import tqdm

from adalayers import run as runlib
from adalayers.encoding import EncodedSplit, batches
from adalayers.evaluate import example_predictions, score
from adalayers.sidetask import IGNORE
from adalayers.states import LiveStates
from adalayers.precision import autocast_for
from adalayers.train import TrainingError


def _f(default, help: str):
    return field(default=default, metadata={"help": help})


@dataclass
class OptimConfig:
    """How the harness trains a strategy; each strategy's config extends this with its own defaults."""
    lr: float | None = _f(None, "AdamW learning rate (None = train.lr of the run config).")
    weight_decay: float = _f(0.0, "AdamW weight decay.")
    schedule: str = _f("constant", "constant, or linear (warm up over warmup_fraction of the steps, then decay to 0).")
    warmup_fraction: float = _f(0.1, "Share of all steps spent warming up (schedule=linear).")

    def check(self) -> list[str]:
        p = []
        if self.lr is not None and self.lr <= 0:
            p.append(f"lr: must be positive, got {self.lr}")
        if self.schedule not in ("constant", "linear"):
            p.append(f"schedule: must be constant or linear, got {self.schedule!r}")
        if not 0 <= self.warmup_fraction < 1:
            p.append(f"warmup_fraction: must be in [0, 1), got {self.warmup_fraction}")
        return p


@dataclass
class Trained:
    """What a strategy reports after training; `infer(batch, n)` runs n side tasks on one batch."""
    results: dict                       # {"validation": metrics, "test": metrics}
    trainable_params: int
    train_seconds: float
    epochs: int
    best_epoch: int
    infer: Callable[[dict, int], None]
    extra: dict = field(default_factory=dict)


def loss_for(kind: str, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    if kind == "regression":
        return nnf.mse_loss(logits.float(), labels.float())
    return nnf.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE)


def count_trainable(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def digest(module: nn.Module) -> str:
    """sha256 over every tensor of the state dict (not cached): equal digests = bit-identical weights."""
    h = hashlib.sha256()
    for key, tensor in sorted(module.state_dict().items()):
        h.update(key.encode())
        h.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


# --- frozen-base strategies share the base's pass -------------------------------------------------

class SharedPassModel(nn.Module):
    """A side task fed by taps on the frozen base (begin / tap / end, like SideTask).

    The backbone is held outside the module tree, so .train() never switches the base's dropout
    on and .parameters() never lists its weights.
    """

    def __init__(self, backbone, side: nn.Module, kind: str, labels: list[str]):
        super().__init__()
        self.side, self.kind, self.labels = side, kind, list(labels)
        self.pad_id = backbone.tokenizer.pad_token_id or 0
        self._live = LiveStates(backbone)
        self._source = [self._live]  # a list: not registered as a submodule
        self._copies: list[nn.Module] = []

    def use_source(self, source) -> None:
        """Training and scoring read their hidden states from `source` (e.g. the cache); `infer`, which
        times the side task as it would serve, keeps running the live base."""
        self._source[0] = source

    def forward(self, batch: dict) -> torch.Tensor:
        self._source[0].run(batch, [self.side])
        return self.side.end(batch["attention_mask"])

    def loss(self, logits, labels):
        return self.side.loss(logits, labels)

    @torch.no_grad()
    def infer(self, batch: dict, n: int) -> None:
        run_shared(self._live, self.side, batch, n, self._copies)


@torch.no_grad()
def run_shared(source, side: nn.Module, batch: dict, n: int, cache: list) -> None:
    """n copies of a trained side task, all fed by one base pass."""
    while len(cache) < n:
        cache.append(copy.deepcopy(side).eval())
    tasks = cache[:n]
    source.run(batch, tasks)
    for t in tasks:
        t.end(batch["attention_mask"])


# --- training ------------------------------------------------------------------------------------

@torch.no_grad()
def row_outputs(model, split: EncodedSplit, batch_size: int, pad_id: int, autocast=None) -> list:
    model.eval()
    outs: list = [None] * len(split.rows)
    for batch in batches(split, batch_size, pad_id):
        with autocast() if autocast else contextlib.nullcontext():
            logits = model(batch).float()
        values = logits.cpu().tolist() if model.kind == "regression" else torch.softmax(logits, -1).cpu()
        for j, i in enumerate(batch["index"].tolist()):
            outs[i] = values[j]
    return outs


def evaluate(model, split: EncodedSplit, examples, batch_size: int, pad_id: int, autocast=None) -> dict:
    outs = row_outputs(model, split, batch_size, pad_id, autocast)
    return score(model, examples, example_predictions(model, split, outs, examples))


def _scheduler(opt, oc: OptimConfig, total_steps: int):
    if oc.schedule == "constant":
        return torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    warm = max(1, int(oc.warmup_fraction * total_steps))
    return torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / warm if s < warm else max(0.0, (total_steps - s) / max(1, total_steps - warm)))


def fit(model: nn.Module, data, encoded: dict, cfg, oc: OptimConfig, out: Path | None = None,
        device: torch.device | None = None, desc: str = "") -> dict:
    """Train `model`, keep its best epoch on validation, restore it; returns a summary."""
    tc = cfg.train
    device = device or torch.device("cpu")
    model.to(device)
    autocast = autocast_for(tc.precision, device)
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise TrainingError(f"{desc or 'strategy'}: nothing to train (no parameter requires grad)")
    opt = torch.optim.AdamW(params, lr=oc.lr if oc.lr is not None else tc.lr, weight_decay=oc.weight_decay)
    steps_per_epoch = math.ceil(len(encoded["train"].rows) / tc.batch_size)
    sched = _scheduler(opt, oc, steps_per_epoch * tc.max_epochs)
    gen = torch.Generator().manual_seed(tc.seed)
    pad_id = model.pad_id
    log_path = Path(out) / "log.jsonl" if out else None
    if log_path:
        log_path.unlink(missing_ok=True)
    best, best_epoch, best_state, bad = -math.inf, 0, None, 0
    t_start = time.perf_counter()
    for epoch in range(1, tc.max_epochs + 1):
        t0 = time.perf_counter()
        model.train()
        losses = []
        bar = tqdm(batches(encoded["train"], tc.batch_size, pad_id, shuffle=True, generator=gen),
                   total=steps_per_epoch, desc=f"{desc} epoch {epoch}", leave=False, dynamic_ncols=True)
        for batch in bar:
            with autocast() if autocast else contextlib.nullcontext():
                loss = model.loss(model(batch), batch["labels"].to(device))
            if not torch.isfinite(loss):
                raise TrainingError(f"{desc}: the loss became {loss.item()} in epoch {epoch}")
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if tc.grad_clip:
                torch.nn.utils.clip_grad_norm_(params, tc.grad_clip)
            opt.step()
            sched.step()
            losses.append(loss.item())
            bar.set_postfix(loss=f"{np.mean(losses[-50:]):.4f}")
        val = evaluate(model, encoded["validation"], data.splits["validation"], tc.eval_batch_size, pad_id, autocast)
        metric = val[data.main_metric]
        improved = metric > best
        if improved:
            best, best_epoch, bad = metric, epoch, 0
            best_state = {k: v.detach().clone() for k, v in trainable_state(model).items()}
        else:
            bad += 1
        entry = {"epoch": epoch, "train_loss": float(np.mean(losses)), "validation": _flat(val),
                 "lr": opt.param_groups[0]["lr"], "seconds": round(time.perf_counter() - t0, 3), "best": improved}
        if log_path:
            runlib.append_jsonl(log_path, entry)
        tqdm.write(f"{desc} epoch {epoch:3d}  loss {entry['train_loss']:.4f}  val {data.main_metric} {metric:.4f}"
                   f"{'  *' if improved else ''}  {entry['seconds']:.1f}s")
        if bad >= tc.early_stopping:
            break
    train_seconds = round(time.perf_counter() - t_start, 2)
    model.load_state_dict(best_state, strict=False)
    return {"best_epoch": best_epoch, "best_validation": best, "epochs": epoch, "train_seconds": train_seconds}


def trainable_state(model: nn.Module) -> dict:
    """The tensors a strategy trained (what its run folder keeps)."""
    return {k: v for k, v in model.named_parameters() if v.requires_grad}


def train_and_score(model, data, encoded, cfg, oc: OptimConfig, out: Path | None, device, desc: str) -> dict:
    """fit + validation/test metrics with the selected epoch."""
    summary = fit(model, data, encoded, cfg, oc, out, device, desc)
    autocast = autocast_for(cfg.train.precision, device)
    results = {}
    for split in ("validation", "test"):
        if split in encoded:
            results[split] = evaluate(model, encoded[split], data.splits[split], cfg.train.eval_batch_size,
                                      model.pad_id, autocast)
    return {**summary, "results": results}


def _flat(m: dict) -> dict:
    return {k: v for k, v in m.items() if not isinstance(v, dict)}
