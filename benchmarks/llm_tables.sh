#!/usr/bin/env bash
# Side tasks on a decoder LLM base, next to the encoders: AdaLayers vs single layers vs linear probes.
#
#   BASE=gemma3-270m OUT=runs/llm THREADS=1 bash benchmarks/llm_tables.sh [cola] [conll] [imdb]
#   BASE=minilm-l6 TAG=_subset CONLL_LAYERS=3,6 IMDB_LAYERS=3,6 bash benchmarks/llm_tables.sh conll imdb
#   SEEDS=3 TAG=_seeds3 bash benchmarks/llm_tables.sh cola        # every run with 3 seeds: medians, min-max
#
# TAG (default empty) is appended to every run and result name (<task>_<BASE><TAG>): an encoder run on
# the decoder's subsets then sits beside, not over, that encoder's full-data results.
# SEEDS (default 1) trains AdaLayers and every pinned layer with that many seeds (train/sweep-layers --seeds);
# give it a TAG of its own, since a folder of single runs is not reused as one of seeds.
#
# For each task: the AdaLayers run (configs/<task>.yaml on BASE), `adalayers sweep-layers` on the layers in
# <TASK>_LAYERS (the same head pinned to one layer; the last state is the final norm's output), and for
# the sequence tasks benchmarks/linear_probes.py (logistic regression per layer on mean-pooled and
# last-token states, and on all layers concatenated). Every step reads the hidden-state cache the first
# one fills, and skips what a finished run folder already holds, so an interrupted run continues.
# Then benchmarks/llm_table.py writes benchmarks/results/llm_table.md from the results.
#
# Sizes (CoLA: about an hour on an idle 2-core CPU for gemma3-270m; CoNLL and IMDB take longer):
#   CoLA   full: 7,695 train / 856 validation / 1,043 test (GLUE dev) sentences
#   CoNLL  CONLL_TRAIN training sentences (default 3,000), CONLL_EVAL validation and test (default 1,000 each)
#   IMDB   IMDB_TRAIN training reviews (default 1,000), IMDB_EVAL validation and test (default 500 each,
#          label-balanced), the first IMDB_LEN tokens (default 128)
set -euo pipefail
BASE=${BASE:-gemma3-270m}
OUT=${OUT:-runs/llm}
TAG=${TAG:-}
THREADS=${THREADS:-1}
SEEDS=${SEEDS:-1}
COLA_LAYERS=${COLA_LAYERS:-9,12,18}
CONLL_LAYERS=${CONLL_LAYERS:-9,18}
IMDB_LAYERS=${IMDB_LAYERS:-9,18}
CONLL_TRAIN=${CONLL_TRAIN:-3000}; CONLL_EVAL=${CONLL_EVAL:-1000}; CONLL_EPOCHS=${CONLL_EPOCHS:-20}
IMDB_TRAIN=${IMDB_TRAIN:-1000}; IMDB_EVAL=${IMDB_EVAL:-500}; IMDB_LEN=${IMDB_LEN:-128}
TASKS=("$@"); [ ${#TASKS[@]} -gt 0 ] || TASKS=(cola conll imdb)
echo "settings: BASE=$BASE TAG=$TAG OUT=$OUT THREADS=$THREADS SEEDS=$SEEDS COLA_LAYERS=$COLA_LAYERS CONLL_LAYERS=$CONLL_LAYERS" \
     "IMDB_LAYERS=$IMDB_LAYERS CONLL_TRAIN=$CONLL_TRAIN CONLL_EVAL=$CONLL_EVAL CONLL_EPOCHS=$CONLL_EPOCHS" \
     "IMDB_TRAIN=$IMDB_TRAIN IMDB_EVAL=$IMDB_EVAL IMDB_LEN=$IMDB_LEN tasks=${TASKS[*]}"

run_task() {  # task config layers probes? extra --set...
  local task=$1 config=$2 layers=$3 probes=$4; shift 4
  local sets=(--set "model.base=$BASE" --set "train.num_threads=$THREADS")
  for s in "$@"; do sets+=(--set "$s"); done
  local name="$BASE$TAG"
  local run="$OUT/${task}_$name"
  if [ "$SEEDS" -gt 1 ]; then  # AdaLayers' seeds train in the sweep's folder (adalayers/seed_<s>), and resume there
    adalayers sweep-layers "$config" "${sets[@]}" --layers "$layers" --seeds "$SEEDS" --out "$OUT/sweep_${task}_$name"
  else
    if [ ! -f "$run/metrics.json" ]; then
      adalayers train "$config" "${sets[@]}" --out "$run" --overwrite
    fi
    adalayers sweep-layers "$config" "${sets[@]}" --layers "$layers" --adalayers "$run" --out "$OUT/sweep_${task}_$name"
  fi
  python -m adalayers.lab.portable "$OUT/sweep_${task}_$name" "benchmarks/results/sweep_${task}_$name" sweep.json sweep.md
  if [ "$probes" = yes ]; then
    local psets=(); for s in "$@"; do psets+=(--set "$s"); done
    python benchmarks/linear_probes.py "$config" --base "$BASE" --tag "$TAG" --set "train.num_threads=$THREADS" "${psets[@]}"
  fi
}

for t in "${TASKS[@]}"; do
  case $t in
    cola)  run_task cola configs/cola.yaml "$COLA_LAYERS" yes ;;
    conll) run_task conll2003 configs/conll.yaml "$CONLL_LAYERS" no "task.max_train_examples=$CONLL_TRAIN" \
             "task.max_eval_examples=$CONLL_EVAL" "train.max_epochs=$CONLL_EPOCHS" ;;
    imdb)  run_task imdb configs/imdb.yaml "$IMDB_LAYERS" yes "task.max_train_examples=$IMDB_TRAIN" \
             "task.max_eval_examples=$IMDB_EVAL" "model.max_length=$IMDB_LEN" ;;
    *) echo "unknown task $t (cola, conll, imdb)" >&2; exit 2 ;;
  esac
done
python benchmarks/llm_table.py --base "$BASE$TAG"
