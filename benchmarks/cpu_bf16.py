"""Trained heads scored with the base in fp32 and in bf16 on this CPU, side by side.

    python benchmarks/cpu_bf16.py runs/cola_minilm-l6 runs/conll2003_minilm-l6 [--repeats 3]
    python benchmarks/cpu_bf16.py runs/imdb_minilm-l6 --set task.max_eval_examples=2000

For each run folder: its test split, with the live base every time (no cache), evaluated under
train.precision=fp32 and =bf16 in turn, --repeats times, alternating. Reports the median seconds of
each, their ratio, both test metrics and how many predictions agree (examples; words for token tasks).
bf16 pays only on a CPU with bf16 instructions (AVX512-BF16 or AMX); the script prints which it has.
Writes <out>.json and <out>.md.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from adalayers import config
from adalayers.recipes import service
from adalayers.store import run as runlib
from adalayers.recipes.evaluate import evaluate_split
from adalayers.model.precision import autocast_for, cpu_bf16_flags
from adalayers.model.states import LiveStates


def agreement(a: list, b: list) -> float:
    """Share of equal predictions: labels per example, tags per word (token tasks), values to 2 decimals."""
    def flat(preds):
        if preds and isinstance(preds[0], list):
            return [tag for tags in preds for tag in tags]
        return [p[0] if isinstance(p, tuple) else round(p, 2) for p in preds]
    a, b = flat(a), flat(b)
    return sum(x == y for x, y in zip(a, b)) / len(a)


def measure(run_dir: Path, overrides: list[str], repeats: int) -> dict:
    cfg = config.from_dict(runlib.run_config(run_dir).to_dict(), ["train.device=cpu", *overrides])
    backbone, data, encoded = service.prepare(cfg)
    task, _, _ = runlib.load_head(run_dir, backbone)
    source, pad_id = LiveStates(backbone), backbone.tokenizer.pad_token_id or 0
    times, results = {"fp32": [], "bf16": []}, {}
    for _ in range(repeats):
        for precision in times:
            t0 = time.perf_counter()
            results[precision] = evaluate_split(task, source, encoded["test"], data.splits["test"],
                                                cfg.train.eval_batch_size, pad_id,
                                                autocast_for(precision, backbone.device))
            times[precision].append(time.perf_counter() - t0)
    median = {p: statistics.median(t) for p, t in times.items()}
    return {"run": str(run_dir), "task": data.name, "base": cfg.model.base, "max_length": cfg.model.max_length,
            "test_examples": len(data.splits["test"]), "main_metric": data.main_metric,
            "seconds": {p: round(m, 2) for p, m in median.items()}, "bf16_speedup": round(median["fp32"] / median["bf16"], 2),
            "metric": {p: round(results[p][0][data.main_metric], 4) for p in times},
            "agreement": round(agreement(results["fp32"][1], results["bf16"][1]), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="trained run folders")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                    help="config overrides for every run, e.g. task.max_eval_examples=2000")
    ap.add_argument("--out", default="benchmarks/results/cpu_bf16")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = [measure(r, args.set, args.repeats) for r in args.runs]
    env = {"cpu": platform.processor() or platform.machine(), "bf16_flags": cpu_bf16_flags(), "threads": args.threads,
           "torch": torch.__version__, "repeats": args.repeats, "overrides": args.set}
    lines = [f"### Test split scored with the base in fp32 and in bf16 (CPU, {args.threads} threads, bf16 "
             f"instructions: {', '.join(env['bf16_flags']) or 'none'}, median of {args.repeats}, torch {torch.__version__})",
             "", f"Overrides: {' '.join(args.set) or 'none'}", "",
             "| task | base | max_length | test examples | fp32 s | bf16 s | fp32 / bf16 | metric fp32 | metric bf16 | "
             "predictions agreeing |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['task']} | {r['base']} | {r['max_length']} | {r['test_examples']:,} | {r['seconds']['fp32']} | "
                     f"{r['seconds']['bf16']} | {r['bf16_speedup']}x | {r['main_metric']} {r['metric']['fp32']} | "
                     f"{r['metric']['bf16']} | {r['agreement']:.2%} |")
    md = "\n".join(lines) + "\n"
    print(md)
    out = Path(args.out)
    runlib.write_json(out.with_suffix(".json"), {"env": env, "rows": rows})
    runlib.atomic_write(out.with_suffix(".md"), md)


if __name__ == "__main__":
    main()
