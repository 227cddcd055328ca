#!/bin/bash
# The strategy comparison on CoLA with MiniLM-L6. CPU-sized by default: 1,000 training rows, 3 epochs,
# the first 500 validation and 500 test (GLUE dev) rows, 1 thread, inference timed on 300 test rows.
# Full data: TRAIN_ROWS=all EVAL_ROWS=all THREADS=2 OUT=runs/compare-cola-minilm-full bash benchmarks/compare_cola_minilm.sh
# Writes compare.json, compare.md, compare.png and one folder per strategy to $OUT.
# An interrupted run continues where it stopped (--resume reuses finished strategies).
set -euo pipefail
OUT=${OUT:-runs/compare-cola-minilm}
TRAIN_ROWS=${TRAIN_ROWS:-1000}; EVAL_ROWS=${EVAL_ROWS:-500}; EPOCHS=${EPOCHS:-3}; THREADS=${THREADS:-1}
STRATEGIES=${1:-adalayers,last-layer,scalar-mix,concat,finetune,finetune-top:3,adapters,adapters-shared3}
limits=()
[[ $TRAIN_ROWS == all ]] || limits+=(--set "task.max_train_examples=$TRAIN_ROWS")
[[ $EVAL_ROWS == all ]] || limits+=(--set "task.max_eval_examples=$EVAL_ROWS")
echo "settings: configs/cola.yaml, train rows $TRAIN_ROWS, eval rows $EVAL_ROWS, $EPOCHS epochs, $THREADS thread(s), strategies $STRATEGIES -> $OUT"
PYTHONPATH=${PYTHONPATH:-src} python -m adalayers.cli compare configs/cola.yaml "${limits[@]}" \
  --set train.max_epochs="$EPOCHS" --set train.num_threads="$THREADS" --inference-rows 300 \
  --strategies "$STRATEGIES" --out "$OUT" --resume --ablate
