"""Seconds per epoch with and without the hidden-state cache, on the same config and seed, side by side.

    PYTHONPATH=src python benchmarks/cache_speedup.py                   # CoLA, 3 epochs, full data
    PYTHONPATH=src python benchmarks/cache_speedup.py --epochs 5 --set task.max_train_examples=2000
    PYTHONPATH=src python benchmarks/cache_speedup.py --config configs/conll.yaml --epochs 2 --project-epochs 30

Each run trains for exactly --epochs epochs (early stopping off). The cached run starts from an
empty cache folder, so its first epoch includes building the train and validation entries (the
test entry is built at the final evaluation, which the end-to-end time includes).
--project-epochs N also prints what a run of N epochs would take each way, from the measured
times: the fixed cost outside the epochs (loading, the test pass) plus N epochs; it is labelled as a
projection, not a measurement.
Writes <out>.json and <out>.md.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from adalayers import config
from adalayers.recipes import service
from adalayers.store.cache.source import cache_dir
from adalayers.store.cache.store import list_entries


def one_run(cfg_path: str, overrides: list[str], out: Path) -> dict:
    cfg = config.load(cfg_path, overrides)
    t0 = time.perf_counter()
    metrics = service.train(cfg, out)
    wall = time.perf_counter() - t0
    epochs = [json.loads(line)["seconds"] for line in (out / "log.jsonl").read_text().splitlines()]
    return {"epoch_seconds": epochs, "end_to_end_seconds": round(wall, 2), "test": metrics.get("test"),
            "validation": metrics.get("validation"), "layer_weights": metrics["layer_weights"], "cfg": cfg}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/cola.yaml")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads for both runs")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    ap.add_argument("--project-epochs", type=int, action="append", default=[], metavar="N",
                    help="also project the end-to-end time of an N-epoch run from the measured times")
    ap.add_argument("--out", default="benchmarks/results/cache_speedup")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="adalayers-bench-") as tmp:
        tmp = Path(tmp)
        common = [f"train.max_epochs={args.epochs}", f"train.early_stopping={args.epochs + 1}",
                  f"train.num_threads={args.threads}", *args.overrides]
        settings = {"config": args.config, "epochs": args.epochs, "threads": args.threads,
                    "overrides": args.overrides, "torch": torch.__version__, "cache_dir": "a temporary folder, removed after the run"}
        print("settings:", json.dumps(settings))
        live = one_run(args.config, common + ["cache.enabled=false"], tmp / "live")
        cached = one_run(args.config, common + ["cache.enabled=true", f"cache.dir={tmp / 'cache'}"], tmp / "cached")
        entries = list_entries(cache_dir(cached["cfg"]))
        cache_bytes = sum(e["bytes"] for e in entries)
        cache_tokens = sum(e["tokens"] or 0 for e in entries)

    live_median = statistics.median(live["epoch_seconds"])
    later = cached["epoch_seconds"][1:] or cached["epoch_seconds"]
    cached_median = statistics.median(later)
    result = {
        "settings": settings,
        "live": {k: v for k, v in live.items() if k != "cfg"},
        "cached": {k: v for k, v in cached.items() if k != "cfg"},
        "live_median_epoch_s": round(live_median, 3),
        "cached_median_epoch_s": round(cached_median, 3),
        "speedup_per_epoch": round(live_median / cached_median, 2),
        "first_cached_epoch_over_live_epoch": round(cached["epoch_seconds"][0] / live_median, 3),
        "end_to_end_speedup": round(live["end_to_end_seconds"] / cached["end_to_end_seconds"], 2),
        "cache_mb": round(cache_bytes / 1e6, 1),
        "cache_mb_per_1000_tokens": round(cache_bytes / 1e6 / cache_tokens * 1000, 3) if cache_tokens else None,
        "test_metric_difference": {k: round(cached["test"][k] - live["test"][k], 6)
                                   for k in live["test"] if isinstance(live["test"][k], float)},
    }
    # Everything outside the epochs: loading the base, the final test pass (which, cached, builds the
    # test entry). A longer run pays it once, so a projection is this plus N epochs.
    fixed_live = live["end_to_end_seconds"] - sum(live["epoch_seconds"])
    fixed_cached = cached["end_to_end_seconds"] - sum(cached["epoch_seconds"])
    projections = []
    for n in args.project_epochs:
        p_live = fixed_live + n * live_median
        p_cached = fixed_cached + cached["epoch_seconds"][0] + (n - 1) * cached_median
        projections.append({"epochs": n, "live_s": round(p_live, 1), "cached_s": round(p_cached, 1),
                            "speedup": round(p_live / p_cached, 2)})
    result["projected_end_to_end"] = projections
    rows = [
        ("seconds per epoch (median)", f"{live_median:.2f}", f"{cached_median:.2f} (epochs 2+)"),
        ("first epoch (s)", f"{live['epoch_seconds'][0]:.2f}", f"{cached['epoch_seconds'][0]:.2f} (builds the cache)"),
        ("all epochs (s)", " ".join(f"{s:.1f}" for s in live["epoch_seconds"]),
         " ".join(f"{s:.1f}" for s in cached["epoch_seconds"])),
        ("end to end (s, incl. test)", f"{live['end_to_end_seconds']:.1f}", f"{cached['end_to_end_seconds']:.1f}"),
    ] + [(f"test {k}", f"{v:.4f}", f"{cached['test'][k]:.4f}") for k, v in live["test"].items()
         if isinstance(v, float)]
    table = ["| | live base | cached states |", "|---|---|---|"] + [f"| {a} | {b} | {c} |" for a, b, c in rows]
    summary = [f"per-epoch speedup: {result['speedup_per_epoch']}x; first cached epoch / live epoch: "
               f"{result['first_cached_epoch_over_live_epoch']}; end-to-end speedup: {result['end_to_end_speedup']}x",
               f"cache: {result['cache_mb']} MB on disk, {result['cache_mb_per_1000_tokens']} MB per 1,000 tokens"]
    summary += [f"projected (not measured) end to end for {p['epochs']} epochs: {p['live_s']:.0f} s live, "
                f"{p['cached_s']:.0f} s cached ({p['speedup']}x)" for p in projections]
    text = "\n".join([f"settings: `{json.dumps(settings)}`", "", *table, "", *summary])
    print()
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    out.with_suffix(".md").write_text("# Cache speedup\n\n" + text + "\n")
    print(f"\nwrote {out.with_suffix('.json')} and {out.with_suffix('.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
