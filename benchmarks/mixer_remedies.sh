#!/usr/bin/env bash
# Issue 40: the mixer's remedies against the old default and the best single layer on one cell, each row
# `adalayers train CONFIG --seeds SEEDS` from the hidden-state cache, one process with 1 torch thread, rows one
# after another. A row whose folder holds finished seeds reuses them. Then the table (mixer_remedies.py).
#   BASE=mpnet-base bash benchmarks/mixer_remedies.sh runs/mixer_remedies_mpnet default layer6 layer_dropout alpha8
#   BASE=minilm-l6 bash benchmarks/mixer_remedies.sh runs/mixer_remedies_minilm default layer_dropout
#   BASE=gemma3-270m CONFIG=configs/conll.yaml SET="--set task.max_train_examples=3000 --set task.max_eval_examples=1000 \
#     --set train.max_epochs=20" bash benchmarks/mixer_remedies.sh runs/mixer_remedies_gemma_conll default layer9 init_middle
#     (the Gemma CoNLL subset of docs/llm.md; the IMDB subset: benchmarks/llm_tables.sh's IMDB_* settings)
# Rows (the --set each adds; see ROWS below; layerN pins the head to layer N: mixer.pin_layer=N). Every row starts
# from the default before issue 40, the mix learned from the start (mixer.learn_after=0): default is that old
# default, learn_after3 today's;
# CONFIG (default configs/cola.yaml); SET (more --set for every row); SEEDS (default 3).
set -euo pipefail
OUT=${1:?output folder}; shift
BASE=${BASE:-mpnet-base}; SEEDS=${SEEDS:-3}; CONFIG=${CONFIG:-configs/cola.yaml}; SET=${SET:-}
declare -A ROWS=(
  [default]=""
  [layer_dropout]="--set mixer.layer_dropout=0.2"
  [layer_dropout4]="--set mixer.layer_dropout=0.4"
  [alpha8]="--set mixer.alpha=8"
  [logit_lr10]="--set mixer.logit_lr_scale=10"
  [logit_lr01]="--set mixer.logit_lr_scale=0.1"
  [entropy]="--set mixer.entropy_lambda=0.01"
  [freeze2]="--set mixer.freeze_after=2"
  [freeze3]="--set mixer.freeze_after=3"
  [learn_after3]="--set mixer.learn_after=3"
  [warmup2]="--set mixer.warmup_epochs=2"
  [init_middle]="--set mixer.init_layer=middle"
  [alpha8_init_middle]="--set mixer.alpha=8 --set mixer.init_layer=middle"
  [nocut]="--set mixer.cutoff=0"
  [holdout20]="--set mixer.holdout=0.2"
  [holdout10]="--set mixer.holdout=0.1"
  [holdout20_step]="--set mixer.holdout=0.2 --set mixer.holdout_pace=step"
)
mkdir -p "$OUT"
echo "BASE=$BASE CONFIG=$CONFIG SEEDS=$SEEDS SET=\"$SET\" bash benchmarks/mixer_remedies.sh OUT ROWS" > "$OUT/command.txt"
for row in "$@"; do
  [[ $row =~ ^layer([0-9]+)$ ]] && ROWS[$row]="--set mixer.pin_layer=${BASH_REMATCH[1]}"
  [[ -v ROWS[$row] ]] || { echo "unknown row $row (known: layerN ${!ROWS[*]})"; exit 2; }
  # shellcheck disable=SC2086
  adalayers train "$CONFIG" --seeds "$SEEDS" --out "$OUT/$row" --set model.base="$BASE" \
    --set train.num_threads=1 --set cache.enabled=true --set mixer.learn_after=0 $SET ${ROWS[$row]} > "$OUT/$row.log" 2>&1 \
    || { echo "[mixer_remedies] $row failed: $OUT/$row.log"; tail -3 "$OUT/$row.log"; }
done
python3 "$(dirname "$0")/mixer_remedies.py" "$OUT"
