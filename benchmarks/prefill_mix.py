"""A prompt's prefill on llama.cpp with the heads' layer mix, against the same prefill without heads.

One llama.cpp context; one prompt of N tokens (CoLA's training sentences, the GGUF's tokenizer) prefilled by the
server's own function (gguf_steps.decode_rows) in four ways, their order rotating from repeat to repeat:
    alone    no state read
    states   the heads' states read, nothing done with them (what reading costs llama.cpp: a pass whose heads
             read the final state asks every position's output, in decodes of gguf_steps.OUTPUTS_AT_ONCE tokens)
    numpy    the heads' mix as it was before infer/mix_blocks.py: numpy's GELU, matmul and LayerNorm on the eval
             callback's thread (infer/blas.sgemm() made to give None: LayerMix.add's fallback)
    blocks   the heads' mix in row blocks on llama.cpp's OpenMP team (infer/mix_blocks.py)
Per repeat each way's prefill time over alone's; printed: the medians over the repeats (and their range), and
the time the prefill spent inside the mix (LayerMix.add) in numpy's way and in blocks.
Heads: benchmarks/llamacpp_numpy_heads.py's four (configs/cola.yaml's sequence head x 3, configs/conll.yaml's
token head, random weights), reading every state ("final": yes) or every state but the final norm ("final": no,
as the gemma3-270m heads trained by benchmarks/llm_server.py, whose cutoff leaves it out). At 1 thread on 2
cores the mix runs beside llama.cpp (LlamaCpp.beside) on one thread either way.

    nice python benchmarks/prefill_mix.py --base gemma3-270m --threads 2 --tokens 128,512 --repeats 8
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy: as the server holds it (GgufPredictor.load)
import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(ROOT / "src"))

from llamacpp_numpy_heads import engine_free, four_heads  # noqa: E402
from llm_server import prompts_for  # noqa: E402

from adalayers.infer.layer_mix import LayerMix  # noqa: E402


def cell(engine, tok, heads, text: str, n: int, repeats: int) -> dict:
    from adalayers.infer import blas
    from adalayers.infer.gguf_steps import decode_rows
    from adalayers.infer.llamacpp import Row

    ids = tok.encode(text)[:n]
    layers = sorted({i for t in heads for i in t.used_layers()})
    fast = blas.sgemm

    def run(way: str) -> float:
        blas.sgemm = (lambda: None) if way == "numpy" else fast
        mix = None if way == "alone" else Unmixed(heads) if way == "states" else Timed(heads)
        engine_free(engine)
        t0 = time.perf_counter()
        decode_rows(engine, [Row(ids, 0)], mix, layers, None)
        took = time.perf_counter() - t0
        if isinstance(mix, Timed):
            inside[way].append(mix.spent)
        return took

    ways = ["alone", "states", "numpy", "blocks"]
    inside: dict[str, list[float]] = {"numpy": [], "blocks": []}  # seconds a prefill spent in LayerMix.add
    try:
        for way in ways:  # warm: each way's kernels loaded, llama.cpp's buffers sized
            run(way)
        times: dict[str, list[float]] = {w: [] for w in ways}
        for r in range(repeats):
            for way in ways[r % 4:] + ways[:r % 4]:
                times[way].append(run(way))
    finally:
        blas.sgemm = fast
    out = {"tokens": len(ids), "final": "yes" if engine.num_states - 1 in layers else "no",
           "ms_alone": round(statistics.median(times["alone"]) * 1e3, 1)}
    for way in ways[1:]:
        ratios = [b / a for a, b in zip(times["alone"], times[way])]
        out[f"ms_{way}"] = round(statistics.median(times[way]) * 1e3, 1)
        out[f"ratio_{way}"] = round(statistics.median(ratios), 4)
        out[f"ratio_{way}_range"] = [round(min(ratios), 4), round(max(ratios), 4)]
    for way, spent in inside.items():
        out[f"ms_in_mix_{way}"] = round(statistics.median(spent[len(spent) - repeats:]) * 1e3, 1)
    out["in_mix_blocks_over_numpy"] = round(statistics.median(
        [b / a for a, b in zip(inside["numpy"][-repeats:], inside["blocks"][-repeats:])]), 4)
    return out


class Timed(LayerMix):
    """The LayerMix, the seconds spent in its add() summed (the mix's own share of the prefill)."""

    def __init__(self, heads):
        super().__init__(heads)
        self.spent = 0.0

    def add(self, i: int, z) -> None:
        t0 = time.perf_counter()
        super().add(i, z)
        self.spent += time.perf_counter() - t0


class Unmixed:
    """What decode_rows feeds (as a LayerMix), the states taken and dropped: F of zeros."""

    def __init__(self, heads):
        self.tasks, self.n = heads, 0

    def begin(self, n: int) -> None:
        self.n = n

    def add(self, i: int, z) -> None:
        pass

    def take(self) -> list:
        return [np.zeros((self.n, t.k), np.float32) for t in self.tasks]


def below_final(heads: list, final: int) -> list:
    """The heads without the final state (its W and weight dropped, as a cutoff leaves a layer out)."""
    return [replace(t, proj={i: w for i, w in t.proj.items() if i != final}) for t in heads]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="gemma3-270m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=lambda s: [int(x) for x in s.split(",")], default=[128, 512])
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--out", type=Path, default=None, help="a JSON file of the cells (default: printed only)")
    args = ap.parse_args()
    from adalayers.infer.llamacpp import LlamaCpp, gguf_path
    from adalayers.infer.llamacpp_tokenizer import GgufTokenizer

    engine = LlamaCpp(gguf_path(args.base), n_ctx=4096, n_seq=4, n_batch=512, threads=args.threads)
    tok = GgufTokenizer(engine)
    heads = four_heads(engine, tok.adds_bos)
    text = prompts_for(args.base, [max(args.tokens) + 16], [1])[1][0]  # cut to each n after encoding
    settings = {"base": args.base, "threads": args.threads, "repeats": args.repeats, "n_batch": 512,
                "beside": engine.beside(), "cpu": platform.processor() or platform.machine(),
                "cores": os.cpu_count()}
    print(json.dumps(settings), flush=True)
    cells = []
    for final in ("yes", "no"):
        for n in args.tokens:
            chosen = heads if final == "yes" else below_final(heads, engine.num_states - 1)
            cells.append(cell(engine, tok, chosen, text, n, args.repeats))
            print(json.dumps(cells[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"settings": settings, "cells": cells}, indent=1) + "\n")


if __name__ == "__main__":
    main()
