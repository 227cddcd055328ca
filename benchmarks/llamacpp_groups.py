"""One llama.cpp pass over a training-sized batch against the same batch in groups of rows (LlamaCppBackbone runs
a batch larger than its context's sequences in groups): seconds and peak resident memory of each, every state
tapped as a cache build taps them. Each size runs in a fresh process (its own peak memory).

    nice python benchmarks/llamacpp_groups.py --base gemma3-270m --rows 128 --sequences 128,32 --threads 1
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEXT = "The book was written by John and then read by everyone in the room today."


def one(base: str, rows: int, n_seq: int, threads: int) -> dict:
    """In this process: a context of n_seq sequences, one tapped pass over `rows` copies of TEXT."""
    import torch

    sys.path.insert(0, str(ROOT / "src"))
    from adalayers.infer.llamacpp_backbone import LlamaCppBackbone

    torch.set_num_threads(threads)
    b = LlamaCppBackbone.load(base, n_seq=n_seq, threads=threads)
    batch = b.tokenizer([TEXT] * rows, padding=True, return_tensors="pt")
    t0 = time.perf_counter()
    b(batch, taps=[lambda i, z: None], stop_after=b.num_layers - 1)
    seconds = time.perf_counter() - t0
    peak = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
    return {"sequences": n_seq, "groups": -(-rows // n_seq), "seconds": round(seconds, 2),
            "peak_rss_mb": round(peak / 1024), "tokens": int(batch["attention_mask"].sum())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="gemma3-270m")
    ap.add_argument("--rows", type=int, default=128)
    ap.add_argument("--sequences", default="128,32")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # the child process: this many sequences
    ap.add_argument("--out", default="benchmarks/results/llamacpp_groups.json")
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.base, args.rows, args.one, args.threads)))
        return
    runs = []
    for n in (int(x) for x in args.sequences.split(",")):
        cmd = [sys.executable, __file__, "--base", args.base, "--rows", str(args.rows), "--threads",
               str(args.threads), "--one", str(n)]
        out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
        print(json.dumps(runs[-1]), flush=True)
    results = {"settings": {**{k: v for k, v in vars(args).items() if k != "one"}, "text": TEXT,
                            "load_average": [round(x, 1) for x in os.getloadavg()]}, "runs": runs}
    out = Path(args.out)
    out = out if out.is_absolute() else ROOT / out
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
