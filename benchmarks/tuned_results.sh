#!/usr/bin/env bash
# The issue-21 results table for one config: thesis settings, tuned settings, tuned + 3-seed ensemble and the
# best single layer, every row over 3 seeds (median, min-max). Each step resumes: finished runs are reused.
#   bash benchmarks/tuned_results.sh configs/cola.yaml runs/tuned_cola 40            # CONFIG OUT TRIALS
#   SET="--set model.base=mpnet-base" bash benchmarks/tuned_results.sh configs/cola.yaml runs/tuned_cola_mpnet 40
# Set THREADS (default 1) for torch threads. Results: OUT/tuned/metrics.json, OUT/sweep/adalayers/metrics.json (thesis
# settings), OUT/sweep/sweep.md, OUT/tune/tune.json.
set -euo pipefail
CONFIG=${1:?config}; OUT=${2:?output folder}; TRIALS=${3:-40}; THREADS=${THREADS:-1}; SET=${SET:-}
COMMON="--set train.num_threads=$THREADS $SET"
adalayers tune "$CONFIG" --trials "$TRIALS" --out "$OUT/tune" $COMMON                       # searched on validation only
adalayers train "$CONFIG" --out "$OUT/sweep/adalayers" --seeds 3 $COMMON                   # thesis settings, where the
adalayers train "$OUT/tune/best_config.yaml" --out "$OUT/tuned" --seeds 3 --ensemble $COMMON  # tuned, and their ensemble
adalayers sweep-layers "$CONFIG" --out "$OUT/sweep" --seeds 3 $COMMON   # sweep reuses them; best single layer on validation
python - "$OUT" <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
def row(name, m, split="test"):
    s = m["spread"][split][main]
    return f"| {name} | {s['median']:.4f} ({s['min']:.4f}–{s['max']:.4f}) |"
tuned = json.loads((out / "tuned" / "metrics.json").read_text())
main = tuned["main_metric"]
sweep = json.loads((out / "sweep" / "sweep.json").read_text())
best = next(e for e in sweep["layers"] if e["pin_layer"] == sweep["best_layer"])
trials = json.loads((out / "tune" / "trials.json").read_text())
ok = [r for r in trials if r["state"] in ("complete", "pruned")]
failed = [r for r in trials if r not in ok]
searched = f"{len(ok)} trials, {sum(r['seconds'] or 0 for r in ok):.0f} s" + (
    f"; {len(failed)} failed, {sum(r['seconds'] or 0 for r in failed):.0f} s" if failed else "")
lines = [f"| settings | test {main}: median of 3 seeds (min–max) |", "|---|---|",
         row("thesis", json.loads((out / "sweep" / "adalayers" / "metrics.json").read_text())),
         row(f"tuned ({searched})", tuned),
         f"| tuned + 3-seed ensemble | {tuned['ensemble']['test'][main]:.4f} |",
         f"| best single layer ({best['pin_layer']}, on validation) | {best['spread']['test']['median']:.4f} "
         f"({best['spread']['test']['min']:.4f}–{best['spread']['test']['max']:.4f}) |"]
(out / "results.md").write_text("\n".join(lines) + "\n")
print("\n".join(lines))
PY
