"""AdaLayers heads for a multi-task config: a frozen base, one mixer + head per task.

adalayers              every task's head trained on its own (adalayers.recipes.service.train)
adalayers-progressive  the same heads, but a task's head also reads the outputs of the heads it
                       depends_on (the config's progressive-sharing graph):

    logits = head(F) + W_u [u_1(x); u_2(x); ...]      u_j(x) = upstream head j's output on the
                                                      same input as a feature (class probabilities
                                                      or the value), W_u starts at 0

i.e. the head's last linear layer reads the concatenation [pooled F; upstream outputs]. With a
frozen base and frozen upstream heads (freeze_upstream) nothing a downstream loss does can reach
an upstream head, so training the tasks one after another in graph order is exactly joint
training. An upstream head reads the downstream batch's own input (pair tasks: the cross-encoded
pair), from the same base pass or cache read: the upstream heads cost no extra pass.
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from torch import nn

from adalayers.config import Config
from adalayers.lab.multitask.graph import order
from adalayers.lab.multitask.heads import Output
from adalayers.model.sidetask import SideTask
from adalayers.kinds import TaskKind

HEAD_LR = 1e-3


def head_config(mcfg, task: str, max_epochs: int, patience: int, lr: float = HEAD_LR) -> Config:
    """The AdaLayers recipe's config for one task of a multi-task config (cache on, early stopping).

    lr 1e-3: at the recipe's default 1e-4 a head on a few hundred rows is still far from trained after
    a few epochs (STS-B, 300 rows, 3 epochs: dev Pearson 0.35 against 0.72 at 1e-3).
    """
    cfg = Config()
    cfg.task.name, cfg.task.data_dir = task, mcfg.data_dir
    cfg.task.max_train_examples, cfg.task.max_eval_examples = mcfg.train_rows(task), mcfg.max_eval_examples
    cfg.model.base, cfg.model.max_length = mcfg.base, mcfg.max_length
    cfg.train.max_epochs, cfg.train.batch_size, cfg.train.seed = max_epochs, mcfg.batch_size, mcfg.seed
    cfg.train.lr, cfg.train.device = lr, mcfg.device
    cfg.train.early_stopping = max(1, min(patience, max_epochs))
    cfg.train.lr_patience = max(1, cfg.train.early_stopping - 1)
    cfg.train.keep = "head"  # the multi-task rows compare heads (and progressive ones read them)
    return cfg


class ProgressiveTask(SideTask):
    """A SideTask whose output also reads frozen upstream SideTasks' outputs (see the module doc).

    Fed through its own tap() (LiveStates, the cache), which also feeds the upstream heads; not
    through shared_tap / FusedTap, which write only a task's own accumulator.
    """

    def __init__(self, cfg: Config, num_layers: int, hidden_size: int, labels: list[str],
                 upstream: dict[str, SideTask]):
        super().__init__(cfg, num_layers, hidden_size, labels)
        self.upstream = nn.ModuleDict(upstream)
        for p in self.upstream.parameters():
            p.requires_grad_(False)
        width = sum(_width(u) for u in upstream.values())
        self.extra = nn.Linear(width, 1 if self.kind == TaskKind.REGRESSION else max(len(labels), 1))
        nn.init.zeros_(self.extra.weight)
        nn.init.zeros_(self.extra.bias)
        self.upstream.eval()

    def train(self, mode: bool = True):
        super().train(mode)
        self.upstream.eval()  # frozen: no dropout either
        return self

    def begin(self) -> None:
        super().begin()
        for u in self.upstream.values():
            u.begin()

    def tap(self, i: int, z: torch.Tensor, projected: torch.Tensor | None = None) -> None:
        if self._w[i].item() != 0:
            super().tap(i, z, projected)
        with torch.no_grad():
            for u in self.upstream.values():
                if u.uses(i):
                    u.tap(i, z)

    def uses(self, i: int) -> bool:
        return self._w[i].item() != 0 or any(u.uses(i) for u in self.upstream.values())

    def used_layers(self) -> list[int]:
        return sorted(set(super().used_layers()).union(*(u.used_layers() for u in self.upstream.values())))

    @property
    def packed_ok(self) -> bool:
        return super().packed_ok and all(u.packed_ok for u in self.upstream.values())

    def end(self, mask: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            feats = torch.cat([Output(u.kind).feature(u.end(mask).float()) for u in self.upstream.values()], -1)
        out = super().end(mask)
        extra = self.extra(feats.to(self.extra.weight.dtype))
        if self.kind == TaskKind.REGRESSION:
            return out + self.target_scale[1] * extra.squeeze(-1)
        return out + extra


def _width(task: SideTask) -> int:
    return 1 if task.kind == TaskKind.REGRESSION else max(len(task.labels), 1)


def same_settings(stored, want) -> bool:
    """stored == want, except that a key only `want` has is ignored: a setting added to the code after
    the result was stored (the result was run with what that setting's default does)."""
    if isinstance(stored, dict) and isinstance(want, dict):
        return all(k in want and same_settings(v, want[k]) for k, v in stored.items())
    return stored == want


def _same_run(run_dir: Path, cfg: Config) -> bool:
    """Does run_dir hold a finished run of this config (head fields the data fills in aside)?"""
    meta_path, metrics_path = run_dir / "config.json", run_dir / "metrics.json"
    if not (meta_path.is_file() and metrics_path.is_file()):
        return False
    saved = json.loads(meta_path.read_text(encoding="utf-8"))["config"]
    want = cfg.to_dict()
    for c in (saved, want):
        for k in ("kind", "target_mean", "target_std"):
            c["head"].pop(k, None)
    return same_settings(saved, want)


def finished_heads(mcfg, out: Path, max_epochs: int, patience: int, lr: float = HEAD_LR) -> dict:
    """The tasks whose heads finished in `out` (an unfinished variant): {"results", "trainable_params",
    "train_seconds", "tasks"}, or {} when none has."""
    results, params, seconds = {}, 0, 0.0
    for s in mcfg.tasks:
        run_dir = Path(out) / s.name
        if _same_run(run_dir, head_config(mcfg, s.name, max_epochs, patience, lr)):
            m = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
            results[s.name] = {k: m[k] for k in ("validation", "test") if k in m}
            params, seconds = params + m["trainable_params"], seconds + m["train_seconds"]
    return {"results": results, "trainable_params": params, "train_seconds": round(seconds, 2),
            "tasks": list(results)} if results else {}


def train_heads(mcfg, backbone, out: Path, max_epochs: int, patience: int, progressive: bool,
                log=print, lr: float = HEAD_LR, train_rows: dict | None = None) -> dict:
    """Train every task's head; a finished task's run folder is reused as it is.

    Progressive: in graph order (upstream first). Independent heads: the smallest training set
    first (`train_rows`: task -> rows), so an interrupted run has finished as many tasks as it could.

    Returns per-task validation/test metrics, trainable parameters (upstream heads counted once, in
    their own task) and summed training seconds.
    """
    from adalayers.recipes import service
    from adalayers.store import run as runlib

    out = Path(out)
    specs = {s.name: s for s in mcfg.tasks}
    trained: dict[str, SideTask] = {}
    results, params, seconds, epochs = {}, 0, 0.0, {}
    names = order(mcfg.tasks)
    if not progressive and train_rows:
        names = sorted(names, key=lambda t: train_rows.get(t, 0))
    for name in names:
        cfg = head_config(mcfg, name, max_epochs, patience, lr)
        deps = list(specs[name].depends_on) if progressive else []
        build = None
        if deps:
            def build(c, b, d, deps=deps):
                return ProgressiveTask(c, b.num_layers, b.hidden_size, d.labels,
                                       {u: copy.deepcopy(trained[u]) for u in deps})
        run_dir = out / name
        if _same_run(run_dir, cfg):
            log(f"[{out.name}] {name}: finished earlier, reusing {run_dir}")
            m = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
        else:
            log(f"[{out.name}] {name}" + (f" (reads {', '.join(deps)})" if deps else ""))
            m = service.train(cfg, run_dir, backbone=backbone, build_task=build, overwrite=True)
        if progressive:  # the trained head, for the tasks downstream of it
            saved = runlib.run_config(run_dir)
            data = _Labels(runlib.read_config(run_dir)["labels"])
            task = build(saved, backbone, data) if build else None
            trained[name], _, _ = runlib.load_head(run_dir, backbone, task)
        results[name] = {s: m[s] for s in ("validation", "test") if s in m}
        params += m["trainable_params"]
        seconds += m["train_seconds"]
        epochs[name] = {"epochs": m["epochs"], "best_epoch": m["best_epoch"]}
    return {"results": results, "trainable_params": params, "train_seconds": round(seconds, 2),
            "epochs": epochs, "max_epochs": max_epochs, "early_stopping": patience, "lr": lr}


class _Labels:
    """The part of a TaskData that building a task needs: its label names."""

    def __init__(self, labels: list[str]):
        self.labels = labels
