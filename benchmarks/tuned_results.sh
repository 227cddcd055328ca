#!/usr/bin/env bash
# The issue-21 results table for one config: thesis settings, tuned settings, tuned + 3-seed ensemble and the
# best single layer, every row over 3 seeds (median, min-max). Each step resumes: finished runs are reused.
#   bash benchmarks/tuned_results.sh configs/cola.yaml runs/tuned_cola 40            # CONFIG OUT TRIALS
#   SET="--set model.base=mpnet-base" bash benchmarks/tuned_results.sh configs/cola.yaml runs/tuned_cola_mpnet 40
# Set THREADS (default 1) for torch threads. Results: OUT/tuned/metrics.json, OUT/sweep/adalayers/metrics.json (thesis
# settings), OUT/sweep/sweep.md, OUT/tune/tune.json.
# On a machine with room for many runs at once (a GPU and a dozen cores), PROCS=N (default 1) runs the search with
# WORKERS (default 4) processes while the sweep runs beside it in N processes (benchmarks/parallel_sweep.sh), then the
# tuned config's 3 seeds at once. Logs: OUT/tune.log, OUT/sweep/*.log, OUT/tuned/seed_*.log.
set -euo pipefail
CONFIG=${1:?config}; OUT=${2:?output folder}; TRIALS=${3:-40}; THREADS=${THREADS:-1}; SET=${SET:-}
PROCS=${PROCS:-1}; WORKERS=${WORKERS:-4}
COMMON="--set train.num_threads=$THREADS $SET"
here=$(dirname "$0")
seeds() {  # seeds CONFIG DIR [--ensemble]: 3 seeds (at once when PROCS > 1), then their summary
  local config=$1 dir=$2; shift 2
  if (( PROCS > 1 )); then
    mkdir -p "$dir"; local pids=()
    for s in 0 1 2; do
      adalayers train "$config" --out "$dir" --seeds 1 --set train.seed=$s $COMMON > "$dir/seed_$s.log" 2>&1 & pids+=($!)
    done
    for pid in "${pids[@]}"; do wait "$pid" || echo "[tuned_results] a seed of $dir failed (see $dir/seed_*.log)"; done
  fi
  adalayers train "$config" --out "$dir" --seeds 3 "$@" $COMMON    # reuses the finished seeds
}
if (( PROCS > 1 )); then
  mkdir -p "$OUT"
  adalayers tune "$CONFIG" --trials "$TRIALS" --out "$OUT/tune" --workers "$WORKERS" $COMMON > "$OUT/tune.log" 2>&1 &
  tune_pid=$!
  THREADS=$THREADS bash "$here/parallel_sweep.sh" "$CONFIG" "$OUT/sweep" "$PROCS" --seeds 3 $COMMON &
  sweep_pid=$!
  wait "$tune_pid" || { echo "[tuned_results] the search failed: $OUT/tune.log"; tail -5 "$OUT/tune.log"; exit 1; }
  seeds "$OUT/tune/best_config.yaml" "$OUT/tuned" --ensemble
  wait "$sweep_pid"
else
  adalayers tune "$CONFIG" --trials "$TRIALS" --out "$OUT/tune" $COMMON                     # searched on validation only
  seeds "$CONFIG" "$OUT/sweep/adalayers"                             # thesis settings, where the sweep reuses them
  seeds "$OUT/tune/best_config.yaml" "$OUT/tuned" --ensemble         # tuned, and their ensemble
  adalayers sweep-layers "$CONFIG" --out "$OUT/sweep" --seeds 3 $COMMON   # best single layer on validation
fi
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
