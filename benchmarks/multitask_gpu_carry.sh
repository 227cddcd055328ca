#!/usr/bin/env bash
# Prepares $CARRY (default .carry, ignored by git) for benchmarks/multitask_gpu.sh on a GPU machine that has
# PyTorch and transformers but not this project, no network, and takes at most 64 MiB with a call: MiniLM-L6
# as fp16 safetensors (46 MB), the SST / QQP / STS-B data (8 MB), and wheels of adalayers and of what the GPU
# image lacks (pydantic and its parts, seqeval) for CPython 3.12. Run where the project is installed.
set -euo pipefail
CARRY=${CARRY:-.carry}
DATA=${ADALAYERS_DATA:-../shared/data}
grep -qxF "/$CARRY/" .git/info/exclude 2>/dev/null || { mkdir -p .git/info; echo "/$CARRY/" >> .git/info/exclude; }
rm -rf "$CARRY" && mkdir -p "$CARRY/whl" "$CARRY/minilm16" "$CARRY/data/glue"
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$CARRY/whl" \
  "pydantic==$(python3 -c 'import pydantic; print(pydantic.VERSION)')" \
  "pydantic-core==$(python3 -c 'import pydantic_core; print(pydantic_core.__version__)')" \
  annotated-types typing-inspection typing-extensions
python3 -m pip wheel -q --no-deps seqeval==1.2.2 . -w "$CARRY/whl"
cp -r "$DATA/sst" "$DATA/qqp" "$CARRY/data/" && cp -r "$DATA/glue/STS-B" "$CARRY/data/glue/"
python3 - "$CARRY/minilm16" <<'PY'
import shutil, sys
from pathlib import Path
from safetensors.torch import load_file, save_file
from adalayers.model.model_packages import path_for
src, dst = Path(path_for("minilm-l6")), Path(sys.argv[1])
for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
    shutil.copy(src / name, dst / name)
weights = load_file(src / "model.safetensors")
save_file({k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in weights.items()},
          dst / "model16.safetensors", metadata={"format": "pt"})
PY
du -sh "$CARRY"
