#!/usr/bin/env bash
# The long runs of the README's results table, for a machine with a CUDA GPU.
#   bash benchmarks/gpu_results.sh OUT_DIR [TIME_BUDGET_S]
# Environment: BASE (default minilm-l6; or mpnet-base), STEPS (default "imdb conll sweep_conll
# sweep_imdb"; also "report_imdb", "finetune_imdb", "psweep_imdb", "seeds_imdb" and "tuned_conll"), LAYERS (the sweeps'
# layers, e.g. 7,8,9,10,11,12; default all; seeds_imdb's default 3,6), PROCS (psweep_imdb's processes, default 4;
# seeds_imdb's, default 6; tuned_conll's sweep processes, default 7),
# WORKERS (tuned_conll's search processes, default 5), SET (extra --set flags for tuned_conll). Needs the data in
# $ADALAYERS_DATA and the base (package, or a copy in $ADALAYERS_CACHE/models/). Runs the steps in order
# until the time budget is spent; the IMDB training stops between epochs (train.max_minutes) early enough
# to leave 2 minutes for its test pass.
# Each step's run folders are packed into OUT_DIR as soon as it finishes (the sweeps' per-layer heads excepted).
set -uo pipefail
out=${1:?usage: gpu_results.sh OUT_DIR [TIME_BUDGET_S]}; budget=${2:-540}
base=${BASE:-minilm-l6}; steps=${STEPS:-imdb conll sweep_conll sweep_imdb}; layers=(${LAYERS:+--layers "$LAYERS"})
end=$(( $(date +%s) + budget ))
mkdir -p "$out" runs/gpu
left() { echo $(( end - $(date +%s) )); }
step() {  # step NAME COMMAND...: run with the time that is left, then pack what it wrote
  local name=$1; shift
  if (( $(left) < 30 )); then echo "skip $name: no time left"; return; fi
  echo "== $name ($(left) s left)"; timeout "$(left)" "$@" 2>&1 | tr '\r' '\n' | grep -v "it/s\]$" | tee "$out/$name.log" | grep -E "^epoch +[0-9]+ +loss|settings|test|time limit|\|" | tail -40
  # sweep runs' heads and fine-tuned copies of the base are left out: they overrun what one returned file may hold (16 MiB)
  tar czf "$out/runs.tgz" --exclude='runs/gpu/*sweep_*/*/head.safetensors' --exclude='runs/gpu/compare_*/*/trainable.safetensors' \
    --exclude='runs/gpu/tuned_*.safetensors' --exclude='runs/gpu/tuned_*resume.pt' runs/gpu benchmarks/results 2>/dev/null
}
minutes() { python3 -c "print(max(0.5, ($(left) - 120) / 60))"; }  # training time that leaves 2 min to test
for s in $steps; do
  case $s in
    # IMDB runs the base live: on a GPU an epoch's base pass costs seconds, while MiniLM's cache (54 GB, within
    # configs/imdb.yaml's cache.max_gb) takes minutes to write and most of the machine's 64 GB disk
    imdb)  step imdb python3 benchmarks/train_table.py configs/imdb.yaml --base "$base" --out runs/gpu \
             --set train.max_minutes="$(minutes)" --set train.eval_batch_size=256 --set cache.enabled=false ;;
    conll) step conll python3 benchmarks/train_table.py configs/conll.yaml --base "$base" --out runs/gpu ;;
    report_imdb) step report_imdb python3 -m adalayers.cli report "runs/gpu/imdb_$base" ;;
    sweep_conll) step sweep_conll python3 -m adalayers.cli sweep-layers configs/conll.yaml --out runs/gpu/sweep_conll \
             --set model.base="$base" --adalayers "runs/gpu/conll2003_$base" --set train.max_epochs=10 "${layers[@]}" ;;
    finetune_imdb) step finetune_imdb python3 -m adalayers.cli compare configs/imdb.yaml --strategies finetune \
             --set model.base="$base" --set train.max_epochs=3 --set train.eval_batch_size=256 --set train.num_threads=4 \
             --out "runs/gpu/compare_imdb_finetune_$base" ;;   # full fine-tuning, the IMDB reference (3 epochs)
    psweep_imdb) step psweep_imdb bash benchmarks/parallel_sweep.sh configs/imdb.yaml runs/gpu/psweep_imdb "${PROCS:-4}" \
             --set model.base="$base" --set train.max_epochs=3 --set train.eval_batch_size=256 --set cache.enabled=false ;;  # 4 at once
    # 3 seeds of AdaLayers and of the single layers in LAYERS (default 3,6: the best on validation in the 1-seed
    # sweep, and the last), PROCS runs at a time (default 6), AdaLayers first, all with the same 10 epochs;
    # train.max_minutes stops each run early enough to leave 2 minutes for the test passes and the table. On an H200
    # an epoch took 28 s a run with 6 runs at once: AdaLayers and layer 3 were done in 500 s, all 9 runs need ~600 s
    seeds_imdb) step seeds_imdb env LAYERS="${LAYERS:-3,6}" THREADS=1 bash benchmarks/parallel_sweep.sh configs/imdb.yaml \
             "runs/gpu/seeds_imdb_$base" "${PROCS:-6}" --seeds 3 --set model.base="$base" --set train.max_minutes="$(minutes)" \
             --set train.eval_batch_size=256 --set cache.enabled=false ;;
    # issue 21's CoNLL-2003 table (benchmarks/tuned_results.sh): a 40-trial search in WORKERS processes beside the
    # 3-seed single-layer sweep in PROCS processes, then the tuned config's 3 seeds and their ensemble. Size the lease
    # for it: on an H200 a cached CoNLL epoch of one process took 13 s, of each of 4 processes 36 s, of each of 13
    # processes about 65 s (small kernels from many processes share the GPU by time slices); the whole step needs
    # on the order of an hour of GPU time, not a 15-minute lease
    tuned_conll) step tuned_conll env PROCS="${PROCS:-7}" WORKERS="${WORKERS:-5}" SET="--set model.base=$base ${SET:-}" \
             bash benchmarks/tuned_results.sh configs/conll.yaml "runs/gpu/tuned_conll_$base" 40 ;;
    sweep_imdb) step sweep_imdb python3 -m adalayers.cli sweep-layers configs/imdb.yaml --out runs/gpu/sweep_imdb \
             --set model.base="$base" --adalayers "runs/gpu/imdb_$base" --set train.max_epochs=3 "${layers[@]}" ;;
    *) echo "unknown step $s"; exit 2 ;;
  esac
done
nvidia-smi --query-gpu=name,memory.total --format=csv > "$out/gpu.txt" 2>&1
