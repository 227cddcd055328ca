#!/usr/bin/env bash
# A single-layer sweep split over PROCS processes at once, for a GPU large enough to hold several runs or a CPU's cores
# (IMDB on mpnet-base: 4 processes and AdaLayers on one H200). The units of work are the runs themselves: each
# AdaLayers seed and each (layer, seed), in a queue, AdaLayers first, then the layers in the order LAYERS gives;
# PROCS of them train at a time, each with `adalayers train` into the folder where sweep-layers looks for it
# (OUT_DIR/adalayers/, OUT_DIR/layer_<i>/, with --seeds N: .../seed_<s>/). A unit whose folder already holds a
# finished run is skipped. A last sweep-layers call reuses every run (it checks their settings) and writes
# sweep.json / sweep.md / sweep.png; a unit that failed is trained there.
#   bash benchmarks/parallel_sweep.sh CONFIG OUT_DIR PROCS [--seeds N] [--set SECTION.FIELD=VALUE ...]
#   bash benchmarks/parallel_sweep.sh configs/imdb.yaml runs/gpu/psweep_imdb 4 --set model.base=mpnet-base --set train.max_epochs=3
#   LAYERS=3 bash benchmarks/parallel_sweep.sh configs/imdb.yaml runs/gpu/seeds_imdb 6 --seeds 3   # 6 runs at once
# Environment: THREADS (default 2): torch threads per process; LAYERS (default all): the layers to sweep, e.g. 3,6.
# Each run's log: OUT_DIR/adalayers_seed_<s>.log, OUT_DIR/layer_<i>_seed_<s>.log.
set -euo pipefail
config=${1:?config}; dir=${2:?output folder}; procs=${3:?processes}; shift 3
seeds=1; sets=()
while (( $# )); do
  case $1 in
    --seeds) seeds=${2:?--seeds N}; shift 2 ;;
    *) sets+=("$1"); shift ;;
  esac
done
sets+=(--set "train.num_threads=${THREADS:-2}")
mkdir -p "$dir"
trap 'kill 0' INT TERM   # a timeout or Ctrl-C stops every part
read -r layers seed0 < <(python3 -c "import sys; from adalayers import config as c; from adalayers.model.backbone import Backbone
args = sys.argv[2:]
cfg = c.load(sys.argv[1], [v for a, v in zip(args, args[1:]) if a == '--set'])
print(Backbone.load(cfg.model.base, cfg.model.states, 'cpu').num_layers, cfg.train.seed)" "$config" "${sets[@]}")
wanted=${LAYERS:-$(seq -s, 0 $((layers - 1)))}   # in this order: the runs of the first layers start first
units=()   # "ENTRY SEED", AdaLayers first
for entry in adalayers ${wanted//,/ }; do
  for ((s = seed0; s < seed0 + seeds; s++)); do units+=("$entry $s"); done
done
unit() {  # unit ENTRY SEED: train one run unless its folder holds a finished one
  local entry=$1 s=$2 out pin=()
  if [[ $entry == adalayers ]]; then out=$dir/adalayers; else out=$dir/layer_$entry; pin=(--set "mixer.pin_layer=$entry"); fi
  (( seeds > 1 )) && out=$out/seed_$s
  if [[ -f $out/metrics.json ]]; then echo "[psweep] $out is finished"; return; fi
  python3 -m adalayers.cli train "$config" "${sets[@]}" "${pin[@]}" --set "train.seed=$s" --out "$out" --overwrite
}
echo "[psweep] $config: AdaLayers and layers $wanted (of 0..$((layers - 1))), $seeds seed(s) each:" \
     "${#units[@]} runs, $procs at a time -> $dir"
running=0 failed=0
for u in "${units[@]}"; do   # a queue: the next run starts as soon as one of the running ones ends
  if (( running >= procs )); then wait -n || failed=1; running=$((running - 1)); fi
  read -r entry s <<< "$u"; log=$dir/$([[ $entry == adalayers ]] || echo layer_)${entry}_seed_$s.log
  unit "$entry" "$s" > "$log" 2>&1 & running=$((running + 1))
done
while (( running > 0 )); do wait -n || failed=1; running=$((running - 1)); done
(( failed == 0 )) || echo "[psweep] a run failed (see $dir/*_seed_*.log); the last call below trains what is missing"
python3 -m adalayers.cli sweep-layers "$config" "${sets[@]}" --out "$dir" --layers "$wanted" --seeds "$seeds"
