#!/usr/bin/env bash
# Issue 40's many-class row: a 17-class task trained through `adalayers train --data` (the settings --data picks
# for a task of 10 classes or more), the mixer's rows against single layers, as benchmarks/mixer_remedies.sh.
#   BASE=minilm-l6 SEEDS=3 bash benchmarks/many_classes.sh runs/many_classes default learn_after3 layer3
# The task: which of the 17 publications a CoLA sentence was taken from (CoLA's first column; the data folder
# has no task of 10 classes or more). Training: CoLA's train.tsv, validation a stratified 10% of it (as --data
# does), test: the rows of CoLA's dev.tsv from those 17 publications (its other 6 sources never occur in
# training), written to OUT/test.tsv. Rows: default (mixer.learn_after=0, the default before issue 40),
# learn_after3, layerN (the head on layer N alone). Each row one process with 1 torch thread, from the cache.
set -euo pipefail
OUT=${1:?output folder}; shift
BASE=${BASE:-minilm-l6}; SEEDS=${SEEDS:-3}; DATA=${ADALAYERS_DATA:-../shared/data}
COLA=$DATA/glue/CoLA
declare -A ROWS=([default]="--set mixer.learn_after=0" [learn_after3]="--set mixer.learn_after=3")
mkdir -p "$OUT"
echo "BASE=$BASE SEEDS=$SEEDS bash benchmarks/many_classes.sh OUT ROWS" > "$OUT/command.txt"
awk -F'\t' 'NR == FNR { seen[$1] = 1; next } ($1 in seen)' "$COLA/train.tsv" "$COLA/dev.tsv" > "$OUT/test.tsv.part"
mv "$OUT/test.tsv.part" "$OUT/test.tsv"
for row in "$@"; do
  [[ $row =~ ^layer([0-9]+)$ ]] && ROWS[$row]="--set mixer.pin_layer=${BASH_REMATCH[1]}"
  [[ -v ROWS[$row] ]] || { echo "unknown row $row (known: layerN ${!ROWS[*]})"; exit 2; }
  # shellcheck disable=SC2086
  adalayers train --data "$COLA/train.tsv" --text 3 --label 0 --test "$OUT/test.tsv" --seeds "$SEEDS" \
    --out "$OUT/$row" --set model.base="$BASE" --set train.num_threads=1 --set cache.enabled=true ${ROWS[$row]} \
    > "$OUT/$row.log" 2>&1 || { echo "[many_classes] $row failed: $OUT/$row.log"; tail -3 "$OUT/$row.log"; }
done
python3 "$(dirname "$0")/mixer_remedies.py" "$OUT"
