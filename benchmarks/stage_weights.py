"""Move a model folder to a machine over a link that carries only small parts (the lent GPU machine
takes 64 MiB a call), and rebuild it there.

    python benchmarks/stage_weights.py pack MODEL_DIR OUT_DIR [--chunk-mb 64]
    python benchmarks/stage_weights.py unpack OUT_DIR MODEL_DIR     # on the other machine

pack rounds every float tensor of model.safetensors to fp16 (the run computes in bf16 on a GPU anyway),
splits each fp16 value into its high byte (xz-compressed: sign and exponent repeat a lot) and its low byte
(stored as is), and cuts the result into chunk.NN files. unpack rebuilds an fp32 model.safetensors from the
fp16 values. all-mpnet-base-v2 goes from 438 MB to 187 MB of chunks; the largest relative change of a
tensor is 5e-4. The IMDB run on mpnet-base in the README used weights rounded and staged the same way.
"""
import argparse
import json
import lzma
import shutil
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file


def pack(model_dir: Path, out: Path, chunk_mb: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tensors = load_file(str(model_dir / "model.safetensors"))
    floats = [v.to(torch.float16).numpy().reshape(-1) for v in tensors.values() if v.is_floating_point()]
    pairs = np.concatenate(floats).view(np.uint8).reshape(-1, 2)  # little-endian: [low byte, high byte]
    high = lzma.compress(pairs[:, 1].tobytes(), preset=9)
    others = {k: v for k, v in tensors.items() if not v.is_floating_point()}
    save_file(others, str(out / "others.safetensors"))
    meta = {"high_xz_bytes": len(high), "tensors": [[k, list(v.shape), v.is_floating_point()] for k, v in tensors.items()]}
    (out / "meta.json").write_text(json.dumps(meta))
    blob, size = high + pairs[:, 0].tobytes(), int(chunk_mb * 1e6)
    for i in range(0, len(blob), size):
        (out / f"chunk.{i // size:02d}").write_bytes(blob[i:i + size])
    for f in model_dir.iterdir():
        if f.is_file() and f.name != "model.safetensors":
            shutil.copy(f, out / f"file.{f.name}")
    print(f"packed {model_dir} into {len(range(0, len(blob), size))} chunks, {len(blob) / 1e6:.1f} MB, in {out}")


def unpack(staged: Path, model_dir: Path) -> None:
    meta = json.loads((staged / "meta.json").read_text())
    blob = b"".join(p.read_bytes() for p in sorted(staged.glob("chunk.*")))
    high = np.frombuffer(lzma.decompress(blob[:meta["high_xz_bytes"]]), np.uint8)
    low = np.frombuffer(blob[meta["high_xz_bytes"]:], np.uint8)
    if len(high) != len(low):
        raise SystemExit(f"{staged}: chunks missing or damaged ({len(low)} low bytes for {len(high)} high bytes)")
    values = np.stack([low, high], 1).reshape(-1).view(np.float16)
    others, tensors, at = load_file(str(staged / "others.safetensors")), {}, 0
    for name, shape, is_float in meta["tensors"]:
        if is_float:
            n = int(np.prod(shape))
            tensors[name] = torch.from_numpy(values[at:at + n].astype(np.float32)).reshape(shape)
            at += n
        else:
            tensors[name] = others[name]
    tmp = model_dir.with_name(model_dir.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    for f in staged.glob("file.*"):
        shutil.copy(f, tmp / f.name[len("file."):])
    save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / ".complete").touch()  # what adalayers' model lookup expects of a copy in its cache folder
    shutil.rmtree(model_dir, ignore_errors=True)
    tmp.rename(model_dir)
    print(f"rebuilt {model_dir}: {len(tensors)} tensors")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=["pack", "unpack"])
    ap.add_argument("src", type=Path)
    ap.add_argument("dst", type=Path)
    ap.add_argument("--chunk-mb", type=float, default=64.0)
    a = ap.parse_args()
    pack(a.src, a.dst, a.chunk_mb) if a.action == "pack" else unpack(a.src, a.dst)
