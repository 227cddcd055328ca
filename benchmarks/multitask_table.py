"""The multi-task comparison as one table: quality, cost of training, cost of serving, and the seeds.

Reads what other commands wrote, computes nothing new:

- a compare-multitask output folder (--run): every variant's dev/test metric, trainable parameters, training
  seconds, and the start-up estimate (estimate.json) beside them;
- more compare-multitask folders of the same config at other seeds (--seeds), for the frozen-base variants:
  median and min-max over all seeds, beside the one-seed fine-tuned rows;
- benchmarks/multitask_inference.py's result (--inference): serving all three tasks, as time / one pass of the
  base, median over its rotating repeats; the fine-tuned multi-task variants serve as its (m) (one shared
  fine-tuned base, two passes per pair), the AdaLayers variants as its (s) (one pass, three heads).

    python benchmarks/multitask_table.py --run runs/multitask-cpu \
        --seeds runs/multitask-cpu-seed1 runs/multitask-cpu-seed2 \
        --inference benchmarks/results/multitask/cpu/inference.json --out benchmarks/results/multitask/cpu/table
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from adalayers.store import run as runlib  # noqa: E402

FROZEN = ("adalayers", "adalayers-progressive")
SERVED_AS = {"adalayers": "s", "adalayers-progressive": "s"}  # every other variant: "m"


def load(folder: Path, complete: bool = True) -> dict:
    """A compare-multitask summary (write it with the run's command and --report-only); `complete`: every variant
    finished, else exit naming the ones that did not."""
    summary = json.loads((folder / "compare_multitask.json").read_text(encoding="utf-8"))
    if complete and summary.get("not_run"):
        sys.exit(f"{folder}: not finished ({', '.join(summary['not_run'])} not run); run its command to the end")
    return summary


def serving(inference: dict) -> dict[str, float]:
    """time / (a) per configuration, the median over the repeats of the per-repeat ratio."""
    times = {r["config"]: r["times_s"] for r in inference["rows"]}
    return {c: statistics.median(t / a for t, a in zip(ts, times["a"])) for c, ts in times.items()}


def seed_cells(runs: list[dict], variant: str, task: str, split: str, metric: str) -> str:
    vals = [next(v for v in s["variants"] if v["variant"] == variant)["results"][task][split][metric] for s in runs]
    return f"{statistics.median(vals):.3f} ({min(vals):.3f}-{max(vals):.3f})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", required=True, help="the compare-multitask output folder of the main seed")
    ap.add_argument("--seeds", nargs="*", default=[], help="the same config's folders at other seeds")
    ap.add_argument("--inference", required=True, help="benchmarks/multitask_inference.py's OUT.json")
    ap.add_argument("--out", required=True, help="writes OUT.md and OUT.json")
    ap.add_argument("--partial", action="store_true", help="--run may have unfinished variants: listed as such")
    args = ap.parse_args()

    main_run = load(Path(args.run), complete=not args.partial)
    seed_runs = [load(Path(f)) for f in args.seeds]
    for s in seed_runs:
        if {k: v for k, v in s["config"].items() if k != "seed"} != {k: v for k, v in main_run["config"].items()
                                                                      if k != "seed"}:
            sys.exit("--seeds: a folder was run with another config than --run (only the seed may differ)")
    inference = json.loads(Path(args.inference).read_text(encoding="utf-8"))
    cost = serving(inference)
    tasks, metric = list(main_run["main_metric"]), main_run["main_metric"]
    seeds = [main_run["config"]["seed"]] + [s["config"]["seed"] for s in seed_runs]
    est = main_run.get("estimate_s", {})

    head = " | ".join(f"{t} dev {metric[t]} | {t} test {metric[t]}" for t in tasks)
    lines = [f"Command: `{main_run['command']}` (seed {seeds[0]})", "",
             f"| variant | {head} | trainable params | train s | estimated s | serving 3 tasks / 1 base pass |",
             "|---|" + "---:|---:|" * len(tasks) + "---:|---:|---:|---:|"]
    rows = []
    for v in main_run["variants"]:
        name = v["variant"]
        cells = [f"{v['results'][t][split][metric[t]]:.3f}" for t in tasks for split in ("validation", "test")]
        served = cost[SERVED_AS.get(name, "m")]
        guess = f"{est[name]:.0f}" if name in est else "-"
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {v['trainable_params']:,} | {v['train_seconds']:.0f} | "
                     f"{guess} | {served:.2f} |")
        rows.append({"variant": name, "results": v["results"], "trainable_params": v["trainable_params"],
                     "train_seconds": v["train_seconds"], "estimate_seconds": est.get(name),
                     "serving_ratio": served})
    for name in main_run.get("not_run", []):
        lines.append(f"| {name} | " + " | ".join(["not finished"] * 2 * len(tasks)) + f" | - | - | "
                     f"{est[name]:.0f} | {cost[SERVED_AS.get(name, 'm')]:.2f} |" if name in est else
                     f"| {name} | " + " | ".join(["not finished"] * 2 * len(tasks)) + " | - | - | - | - |")
    st = inference["settings"]
    lines += ["", f"Serving (benchmarks/multitask_inference.py, `{st['command']}`): {st['pairs']} STS-B pairs, "
                  f"batch {st['batch']}, {st['threads']} thread(s), {st['repeats']} rotating repeats, AdaLayers heads "
                  f"{st['heads']}. One base pass = 1.00; the same pairs through three single-task fine-tuned "
                  f"copies (one pass each): {cost['f']:.2f}."]
    seed_rows = []
    if seed_runs:
        lines += ["", f"Frozen-base variants over seeds {', '.join(map(str, seeds))} (median, min-max); the "
                      "hidden-state cache is shared, so each seed costs only its heads' training:", "",
                  f"| variant | {head} |", "|---|" + "---:|---:|" * len(tasks)]
        runs = [main_run] + seed_runs
        for name in FROZEN:
            cells = [seed_cells(runs, name, t, split, metric[t]) for t in tasks for split in ("validation", "test")]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
            seed_rows.append({"variant": name, "seeds": seeds, "cells": cells})
    result = {"run": main_run["command"], "seeds": seeds, "rows": rows, "seed_rows": seed_rows,
              "serving": cost, "serving_settings": st}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    runlib.write_json(out.with_suffix(".json"), result)
    runlib.atomic_write(out.with_suffix(".md"), "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
