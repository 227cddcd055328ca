"""A cached training step and a validation pass on a config's real batches, for one or several source trees side by side.

    PYTHONPATH=src python benchmarks/cached_step.py --config benchmarks/results/tune_conll_minilm/best_config.yaml
    git worktree add /tmp/before c9ae293      # the code before a change, to time both in one run
    PYTHONPATH=src python benchmarks/cached_step.py --config benchmarks/results/tune_conll_minilm/best_config.yaml \\
        --tree /tmp/before --tree . --repeats 3 --at-once --out benchmarks/results/cached_step_conll_tuned
    PYTHONPATH=src python benchmarks/cached_step.py --variant train.head_precision=bf16 --at-once   # a setting, side by side

Each measurement is a fresh process that imports adalayers from <tree>/src. It opens the config's
hidden-state cache (building an entry that is missing, untimed), initialises a head (seed 0), and
trains it with the training engine itself (adalayers.engine.fit, one epoch that stops after --warmup
untimed and --steps timed batches of a seeded epoch): each timed step is the engine's forward pass from
the cache under train.precision, the loss, backward, gradient-norm clipping and the AdamW step. Then it scores the validation split twice and keeps the
second pass (the first maps and checksums the split's cache files). --variant SETTINGS adds the first
tree once more with those settings (comma-separated SECTION.FIELD=VALUE), to time a setting side by
side. Only a cached step is timed here: the live base's pass is what
benchmarks/cache_speedup.py compares it with. The trees take turns, --repeats times in a rotating
order, or with --at-once run at the same moment, each on its own core(s): on a shared machine whose
speed drifts by tens of percent within minutes, taking turns can still put one tree in a slow spell
and the other in a fast one; running together gives both the same spell (and the same contention
for memory). A tree's speed-up is the median over repeats of the first tree's time / its own in the
same repeat. Writes <out>.json and <out>.md.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class TimedFeed:
    """The training split's batches for adalayers.engine.fit, stopping after warmup + steps of them, and the
    time of each engine step after the warm-up: from handing a batch to fit until fit asks for the next one
    (the forward pass from the cache, the loss, backward, clipping, the AdamW step; not the batch's collation)."""

    def __init__(self, feed, warmup: int, steps: int):
        self.feed, self.warmup = feed, warmup
        self.steps = min(warmup + steps, feed.steps)  # the batches of fit's one epoch
        self.times: list[float] = []

    def epoch(self, epoch: int, generator):
        batches = self.feed.epoch(epoch, generator)
        for i in range(self.steps):
            batch = next(batches)
            t0 = time.perf_counter()
            yield batch
            if i >= self.warmup:
                self.times.append(time.perf_counter() - t0)

    def validate(self, epoch: int) -> tuple[float, dict]:
        return 0.0, {}  # the validation pass is timed on its own, after fit


def measure(cfg_path: str, overrides: list[str], steps: int, warmup: int) -> dict:
    """One tree, in this process: median and mean ms per cached training step, seconds per validation pass."""
    import torch

    from adalayers import config
    from adalayers.recipes import service
    from adalayers.data.encoding import SplitFeed
    from adalayers.engine import FitSettings, fit
    from adalayers.recipes.evaluate import evaluate_split
    from adalayers.model.precision import autocast_for
    from adalayers.model.sidetask import SideTask
    from adalayers.model.states import Fed

    cfg = config.load(cfg_path, ["cache.enabled=true", *overrides])
    backbone, data, encoded = service.prepare(cfg)
    torch.manual_seed(cfg.train.seed)
    task = SideTask(cfg, backbone.num_layers, backbone.hidden_size, data.labels, bos=backbone.adds_bos)
    source = service.make_source(cfg, backbone, data, encoded)
    if not hasattr(source, "entry"):
        raise SystemExit(f"{cfg_path}: the hidden-state cache is not in use (too large or not writable): nothing to time")
    for split in ("train", "validation"):
        source.entry(split)  # built here when missing, outside the timing
    pad_id = backbone.tokenizer.pad_token_id or 0
    split_feed = SplitFeed(encoded["train"], cfg.train.batch_size, pad_id, None)
    feed = TimedFeed(split_feed, warmup, steps)
    # the engine's own loop, one epoch of warmup + steps batches: train.precision's autocast, clipping, AdamW
    fit(Fed(task, source), feed, FitSettings.of(cfg.train, max_epochs=1, early_stopping=None, max_minutes=None,
                                                tensorboard=False, desc="cached step"), backbone.device)
    times = feed.times
    autocast = autocast_for(cfg.train.precision, backbone.device)
    passes = []
    for _ in range(2):
        t0 = time.perf_counter()
        evaluate_split(task, source, encoded["validation"], data.splits["validation"], cfg.train.eval_batch_size,
                       pad_id, autocast)
        passes.append(time.perf_counter() - t0)
    return {"step_ms_median": round(statistics.median(times) * 1e3, 2), "step_ms_mean": round(statistics.mean(times) * 1e3, 2),
            "steps": len(times), "steps_per_epoch": split_feed.steps, "validation_s": round(passes[1], 3),
            "torch": torch.__version__}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="benchmarks/results/tune_conll_minilm/best_config.yaml")
    ap.add_argument("--tree", action="append", default=[], metavar="DIR",
                    help="a source tree (its src/ is imported); repeat to compare; default: this repository")
    ap.add_argument("--variant", action="append", default=[], metavar="SETTINGS",
                    help="also the first tree with these comma-separated SECTION.FIELD=VALUE settings; repeatable")
    ap.add_argument("--steps", type=int, default=200, help="timed training steps per measurement")
    ap.add_argument("--warmup", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--at-once", action="store_true",
                    help="run the trees' measurements at the same time (needs trees x threads cores) instead of in turn")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    ap.add_argument("--out", default="benchmarks/results/cached_step")
    ap.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)  # one tree, in this process
    args = ap.parse_args(argv)
    overrides = [f"train.num_threads={args.threads}", *args.overrides]
    if args.measure:
        print(json.dumps(measure(args.config, overrides, args.steps, args.warmup)))
        return 0

    trees = [Path(t).resolve() for t in args.tree] or [ROOT]
    for t in trees:
        if not (t / "src" / "adalayers").is_dir():
            raise SystemExit(f"--tree {t}: no src/adalayers there")
    # what is measured: each tree as it is, then the first tree once per --variant
    extra = [[] for _ in trees] + [v.split(",") for v in args.variant]
    labels = [_describe(t) for t in trees] + [f"{_describe(trees[0])} with {v}" for v in args.variant]
    trees = trees + [trees[0]] * len(args.variant)
    settings = {"config": args.config, "overrides": overrides, "steps": args.steps, "warmup": args.warmup,
                "repeats": args.repeats, "trees": labels, "machine": platform.machine(),
                "at_once": args.at_once,
                "note": "each tree in its own process; " + ("all at the same time" if args.at_once else
                                                             "in a rotating order per repeat")}
    print("settings:", json.dumps(settings), flush=True)
    runs: list[list[dict]] = [[] for _ in trees]
    cmd = [sys.executable, __file__, "--measure", "--config", args.config, "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--threads", str(args.threads),
           *[a for o in args.overrides for a in ("--set", o)]]

    def start(j: int) -> subprocess.Popen:
        env = {**os.environ, "PYTHONPATH": str(trees[j] / "src")}
        return subprocess.Popen(cmd + [a for o in extra[j] for a in ("--set", o)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def finish(j: int, proc: subprocess.Popen, r: int) -> None:
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"{labels[j]}: the measurement failed:\n{err[-2000:]}")
        runs[j].append(json.loads(out.strip().splitlines()[-1]))
        print(f"repeat {r + 1}, {labels[j]}: {runs[j][-1]}", flush=True)

    for r in range(args.repeats):
        if args.at_once:  # every tree at the same moment, each on its own cores: the same drift for all
            procs = [start(j) for j in range(len(trees))]
            for j, proc in enumerate(procs):
                finish(j, proc, r)
            continue
        order = list(range(len(trees)))
        for j in order[r % len(order):] + order[: r % len(order)]:
            finish(j, start(j), r)

    rows = []
    for j, label in enumerate(labels):
        step = [m["step_ms_median"] for m in runs[j]]
        val = [m["validation_s"] for m in runs[j]]
        rows.append({"tree": label, "step_ms": step, "validation_s": val,
                     "step_speedup_vs_first": statistics.median(a["step_ms_median"] / b["step_ms_median"]
                                                                for a, b in zip(runs[0], runs[j])),
                     "validation_speedup_vs_first": statistics.median(a["validation_s"] / b["validation_s"]
                                                                      for a, b in zip(runs[0], runs[j]))})
    steps_per_epoch = runs[0][0]["steps_per_epoch"]
    md = [f"# A cached training step ({steps_per_epoch} steps an epoch) and a validation pass", "",
          f"Settings: `{json.dumps(settings)}`", "",
          "| tree | ms per step (median of the steps, per repeat) | validation pass, s (per repeat) | step speed-up vs the first | validation speed-up |",
          "|---|---|---|---:|---:|"]
    md += [f"| {r['tree']} | {', '.join(f'{x:.1f}' for x in r['step_ms'])} | {', '.join(f'{x:.2f}' for x in r['validation_s'])} "
           f"| {r['step_speedup_vs_first']:.2f}x | {r['validation_speedup_vs_first']:.2f}x |" for r in rows]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps({"settings": settings, "results": rows, "runs": runs}, indent=2) + "\n")
    out.with_suffix(".md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    return 0


def _describe(tree: Path) -> str:
    """The tree's commit (and whether its src/ has changes on top of it), else its path."""
    try:
        commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--", "src"], capture_output=True,
                               text=True, check=True).stdout.strip()
        return f"{commit}{' + changes' if dirty else ''}"
    except (OSError, subprocess.CalledProcessError):
        return str(tree)


if __name__ == "__main__":
    sys.exit(main())
