#!/usr/bin/env bash
# The multi-task comparison at full scale (docs/multitask.md) on one GPU machine, within one 10-minute call.
#
# What it needs beside the repository, in $CARRY (default .carry, ignored by git), prepared on a machine
# with the project installed by benchmarks/multitask_gpu_carry.sh: the MiniLM-L6 base as fp16 safetensors
# (the fp32 file is over the 64 MiB a device call carries; it is widened back to fp32 here, so the base is
# MiniLM with its weights rounded to fp16), the SST, QQP and STS-B data, and wheels of adalayers and of the
# packages the GPU image lacks (pydantic and its parts, seqeval).
#
# The six fine-tuned and frozen-base variants run at once as separate processes on the one GPU (each is a
# small-batch, launch-bound job; the two AdaLayers variants share one process, as they share the
# hidden-state cache). Their "train s" is therefore measured under that sharing. After LIMIT seconds the
# unfinished ones are stopped and `--report-only` writes the table of those that finished.
# EXTRA adds flags (a smoke test here: EXTRA="--train-rows 16 --eval-rows 8" SKIP_INSTALL=1 LIMIT=300).
# Results: $OUT/compare_multitask.md and .json, $OUT/multitask_gpu.log, $OUT/variants.tar.gz.
set -uo pipefail
CARRY=${CARRY:-.carry}
OUT=${OUT:-runs/multitask-gpu}
LIMIT=${LIMIT:-480}
RUN=${RUN:-runs/multitask-gpu-run}
mkdir -p "$OUT" "$RUN"
if [ -z "${SKIP_INSTALL:-}" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    "$CARRY"/whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
export ADALAYERS_DATA=$CARRY/data HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
BASE=$CARRY/minilm-l6
python3 - "$CARRY/minilm16" "$BASE" <<'EOF' || exit 1
import shutil, sys
from pathlib import Path
from safetensors.torch import load_file, save_file
src, dst = Path(sys.argv[1]), Path(sys.argv[2])
dst.mkdir(parents=True, exist_ok=True)
for f in src.iterdir():
    if f.name != "model16.safetensors":
        shutil.copy(f, dst / f.name)
weights = load_file(src / "model16.safetensors")
save_file({k: (v.float() if v.is_floating_point() else v) for k, v in weights.items()}, dst / "model.safetensors",
          metadata={"format": "pt"})
EOF
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>/dev/null | tee "$OUT/multitask_gpu.log"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available())" | tee -a "$OUT/multitask_gpu.log"
ARGS=(compare-multitask configs/multitask.yaml --out "$RUN" --set "base=$BASE" --set max_train_examples=null
      --set max_eval_examples=null --epochs 3 --adalayers-epochs 20 --no-estimate --threads 2 ${EXTRA:-})
pids=()
for variants in smart pcgrad baseline progressive freeze-top3 adalayers,adalayers-progressive; do
  timeout "$LIMIT" python3 -m adalayers.cli "${ARGS[@]}" --variants "$variants" > "$RUN/${variants%%,*}.log" 2>&1 &
  pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
for f in "$RUN"/*.log; do echo "== $f"; grep -v "it/s\]" "$f" | tail -15; done >> "$OUT/multitask_gpu.log"
python3 -m adalayers.cli "${ARGS[@]}" --report-only >> "$OUT/multitask_gpu.log" 2>&1
cp "$RUN"/compare_multitask.md "$RUN"/compare_multitask.json "$OUT"/ 2>/dev/null
tar -czf "$OUT/variants.tar.gz" --exclude='*.safetensors' --exclude='*.pt' -C "$RUN" . 2>/dev/null
cat "$OUT/compare_multitask.md" 2>/dev/null
