#!/usr/bin/env bash
# A single-layer sweep split over PROCS processes at once, for a GPU large enough to hold several runs
# (IMDB on mpnet-base: 4 processes and AdaLayers on one H200). Layers go round-robin to the processes
# (sweep-layers --no-table), AdaLayers trains beside them with the same settings, and a last sweep-layers
# over every layer reuses all the runs and writes sweep.json / sweep.md / sweep.png.
#   bash benchmarks/parallel_sweep.sh CONFIG OUT_DIR PROCS [--seeds N] [--set SECTION.FIELD=VALUE ...]
#   bash benchmarks/parallel_sweep.sh configs/imdb.yaml runs/gpu/psweep_imdb 4 --set model.base=mpnet-base --set train.max_epochs=3
# Each process's log: OUT_DIR/part_<i>.log and OUT_DIR/adalayers.log. THREADS (default 2): torch threads each.
set -euo pipefail
config=${1:?config}; dir=${2:?output folder}; procs=${3:?processes}; shift 3
sets=("$@" --set "train.num_threads=${THREADS:-2}")
mkdir -p "$dir"
trap 'kill 0' INT TERM   # a timeout or Ctrl-C stops every part
layers=$(python3 -c "import sys; from adalayers import config as c; from adalayers.backbone import Backbone
args = sys.argv[2:]
cfg = c.load(sys.argv[1], [v for a, v in zip(args, args[1:]) if a == '--set'])
print(Backbone.load(cfg.model.base, cfg.model.states, 'cpu').num_layers)" "$config" "${sets[@]}")
echo "[psweep] $config: layers 0..$((layers - 1)) in $procs processes, AdaLayers beside them -> $dir"
pids=()
python3 -m adalayers.cli train "$config" "${sets[@]}" --out "$dir/adalayers" > "$dir/adalayers.log" 2>&1 & pids+=($!)
for ((p = 0; p < procs && p < layers; p++)); do
  python3 -m adalayers.cli sweep-layers "$config" "${sets[@]}" --out "$dir" --no-table \
    --layers "$(seq -s, "$p" "$procs" $((layers - 1)))" > "$dir/part_$p.log" 2>&1 & pids+=($!)
done
failed=0
for pid in "${pids[@]}"; do wait "$pid" || failed=1; done
(( failed == 0 )) || echo "[psweep] a part failed (see $dir/*.log); the last call below trains what is missing"
python3 -m adalayers.cli sweep-layers "$config" "${sets[@]}" --out "$dir"
