#!/usr/bin/env bash
# Issue 40: a sentence-pair task on a decoder base. How the pair reaches the base (the tokenizer's pair
# encoding, which on Gemma puts a second BOS between the texts, against one text joined by a newline:
# task.pair_separator) and how the head pools (mean against the last real token), next to linear probes
# on the same states. QQP (qqp/subset.tsv; stratified 80/10/10, seed 42) on its first TRAIN training pairs
# and EVAL validation and test pairs, configs/cola.yaml's settings otherwise (what `train --data ...
# --text-pair ...` takes for a classification task), the base on llama.cpp (model.runtime; the states
# of benchmarks/results/llamacpp_agreement.json), one torch thread, from the hidden-state cache.
#
#   OUT=runs/pair_decoder bash benchmarks/pair_decoder.sh [ROW ...]
#
# Rows: bos_mean (the tokenizer's pair encoding, mean pooling: the old default), joined_mean (the new
# default), joined_last, bos_last; joined_layer<i> / bos_layer<i> (the same head pinned to layer i);
# probes_bos, probes_joined (benchmarks/linear_probes.py on each encoding's states: mean-pooled and last-token
# states per layer and all layers concatenated). SEEDS (default 1) seeds each head's row. Then
# benchmarks/pair_decoder.py OUT writes the table.
set -euo pipefail
OUT=${OUT:-runs/pair_decoder}; BASE=${BASE:-gemma3-270m}; SEEDS=${SEEDS:-1}
TRAIN=${TRAIN:-4000}; EVAL=${EVAL:-1000}; THREADS=${THREADS:-1}; RUNTIME=${RUNTIME:-llama.cpp}
ROWS=("$@"); [ ${#ROWS[@]} -gt 0 ] || ROWS=(bos_mean joined_mean joined_last joined_layer9 probes_bos probes_joined)
COMMON=(--set task.name=qqp --set task.max_train_examples="$TRAIN" --set task.max_eval_examples="$EVAL"
        --set model.base="$BASE" --set model.runtime="$RUNTIME" --set model.max_length=128
        --set train.num_threads="$THREADS" --set cache.enabled=true)
echo "settings: BASE=$BASE RUNTIME=$RUNTIME TRAIN=$TRAIN EVAL=$EVAL THREADS=$THREADS SEEDS=$SEEDS OUT=$OUT rows=${ROWS[*]}"
mkdir -p "$OUT"
for row in "${ROWS[@]}"; do
  enc=(); [[ $row == *bos* ]] && enc=(--set task.pair_separator=null)  # else the default, a newline
  case $row in
    bos_mean|joined_mean|joined_last|bos_last)
      pool=${row#*_}
      adalayers train configs/cola.yaml --seeds "$SEEDS" --out "$OUT/$row" "${COMMON[@]}" "${enc[@]}" \
        --set head.pooling="$pool" > "$OUT/$row.log" 2>&1 || { echo "[pair_decoder] $row failed: $OUT/$row.log"; tail -3 "$OUT/$row.log"; } ;;
    joined_layer*|bos_layer*)
      adalayers train configs/cola.yaml --seeds "$SEEDS" --out "$OUT/$row" "${COMMON[@]}" "${enc[@]}" \
        --set mixer.pin_layer="${row#*_layer}" > "$OUT/$row.log" 2>&1 || { echo "[pair_decoder] $row failed: $OUT/$row.log"; tail -3 "$OUT/$row.log"; } ;;
    probes_bos|probes_joined)
      python "$(dirname "$0")/linear_probes.py" configs/cola.yaml --base "$BASE" --metric mcc --tag "_qqp_${row#probes_}" \
        "${COMMON[@]}" "${enc[@]}" > "$OUT/$row.log" 2>&1 || { echo "[pair_decoder] $row failed: $OUT/$row.log"; tail -3 "$OUT/$row.log"; } ;;
    *) echo "unknown row $row"; exit 2 ;;
  esac
done
python "$(dirname "$0")/pair_decoder.py" "$OUT" --base "$BASE"
