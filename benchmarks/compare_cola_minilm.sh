#!/bin/bash
# The strategy comparison on CoLA with MiniLM-L6, CPU-sized: 1,000 training rows, 3 epochs,
# the first 500 validation and 500 test (GLUE dev) rows, inference timed on 300 test rows.
# Writes compare.json, compare.md, compare.png and one folder per strategy to $OUT.
# Run it in pieces under 10 minutes each (--resume reuses finished strategies), then once whole.
set -euo pipefail
OUT=${OUT:-runs/compare-cola-minilm}
STRATEGIES=${1:-adalayers,last-layer,scalar-mix,concat,finetune,finetune-top:3,adapters,adapters-shared3}
echo "settings: configs/cola.yaml, 1000 train rows, 500 eval rows, 3 epochs, 1 thread, strategies $STRATEGIES -> $OUT"
PYTHONPATH=${PYTHONPATH:-src} python -m adalayers.cli compare configs/cola.yaml \
  --set task.max_train_examples=1000 --set task.max_eval_examples=500 --set train.max_epochs=3 \
  --set train.num_threads=1 --inference-rows 300 --strategies "$STRATEGIES" --out "$OUT" --resume --ablate
