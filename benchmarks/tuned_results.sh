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
python3 "$here/tuned_table.py" "$OUT"
