#!/usr/bin/env bash
# The long runs of the README's results table, for a machine with a CUDA GPU.
#   bash benchmarks/gpu_results.sh OUT_DIR [TIME_BUDGET_S]
# Needs: the data in $ADALAYERS_DATA, the minilm-l6 base (package, or a copy in
# $ADALAYERS_CACHE/models/all-MiniLM-L6-v2). Runs, in order, until the time budget is spent:
# IMDB and CoNLL-2003 with AdaLayers, then the single-layer sweeps; each step's run folders
# are packed into OUT_DIR as soon as it finishes.
set -uo pipefail
out=${1:?usage: gpu_results.sh OUT_DIR [TIME_BUDGET_S]}; budget=${2:-540}
end=$(( $(date +%s) + budget ))
mkdir -p "$out" runs/gpu
step() {  # step NAME COMMAND...: run with the time that is left, then pack what it wrote
  local name=$1; shift
  local left=$(( end - $(date +%s) ))
  if (( left < 30 )); then echo "skip $name: no time left"; return; fi
  echo "== $name ($left s left)"; timeout "$left" "$@" 2>&1 | tr '\r' '\n' | grep -v "it/s\]$" | tee "$out/$name.log" | grep -E "^epoch +[0-9]+ +loss|settings|test|\|" | tail -40
  tar czf "$out/runs.tgz" runs/gpu benchmarks/results 2>/dev/null
}
step imdb python3 benchmarks/train_table.py configs/imdb.yaml --base minilm-l6 --out runs/gpu
step conll python3 benchmarks/train_table.py configs/conll.yaml --base minilm-l6 --out runs/gpu
step sweep_conll python3 -m adalayers.cli sweep-layers configs/conll.yaml --out runs/gpu/sweep_conll \
  --adalayers runs/gpu/conll2003_minilm-l6 --set train.max_epochs=10
step sweep_imdb python3 -m adalayers.cli sweep-layers configs/imdb.yaml --out runs/gpu/sweep_imdb \
  --adalayers runs/gpu/imdb_minilm-l6 --set train.max_epochs=3
nvidia-smi --query-gpu=name,memory.total --format=csv > "$out/gpu.txt" 2>&1
