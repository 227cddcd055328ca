#!/usr/bin/env bash
# Multi-task recipes on SST-5 / QQP / STS-B with MiniLM-L6, small subsets so it fits in ~6 minutes
# on one CPU thread. Writes benchmarks/results/multitask/compare_multitask.{json,md} (the chart stays in runs/).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHONPATH=src python -m adalayers.cli compare-multitask configs/multitask.yaml --out runs/multitask \
  --train-rows 300 --eval-rows 200 --epochs 1 --adalayers-epochs 3 --threads 1 "$@"
PYTHONPATH=src python -m adalayers.lab.portable runs/multitask benchmarks/results/multitask compare_multitask.json compare_multitask.md
