"""One decode step of the llama.cpp runtime by micro-batch size and eval callback (issue 52's per-token gap).

    python benchmarks/llamacpp_ubatch.py --base gemma3-270m --threads 2

For each setting (n_ctx, n_batch = n_ubatch, eval callback on or off) a fresh LlamaCpp context decodes a
6-token prompt, then --steps single-token steps of one sequence; prints the median step in ms. The runtime
serves with n_ubatch = n_batch (its state reader needs one micro-batch per pass), sized to the longest pass;
llama-server's default micro-batch is 512 and it sets no eval callback.
"""
from __future__ import annotations

import argparse
import statistics
import time

from adalayers.infer.llamacpp import LlamaCpp, Row, gguf_path

SETTINGS = ((4096, 2048, True), (4096, 2048, False), (4096, 512, True), (1024, 512, False))


def step_ms(path, n_ctx: int, n_batch: int, callback: bool, threads: int, steps: int) -> float:
    engine = LlamaCpp(path, n_ctx=n_ctx, n_seq=2, n_batch=n_batch, threads=threads, read_states=callback)
    prompt = [2, 651, 6037, 529, 7001, 563]
    engine.decode([Row(prompt, 0, 0)])
    times = []
    for pos in range(len(prompt), len(prompt) + steps):
        t = time.perf_counter()
        engine.decode([Row([651], 0, pos)])
        times.append(time.perf_counter() - t)
    engine.close()
    return statistics.median(times) * 1000


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", default="gemma3-270m")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=40)
    args = p.parse_args()
    path = gguf_path(args.base)
    print(f"base {args.base} ({path.name}), threads {args.threads}, {args.steps} steps of one token")
    for n_ctx, n_batch, callback in SETTINGS:
        ms = step_ms(path, n_ctx, n_batch, callback, args.threads, args.steps)
        print(f"n_ctx {n_ctx:5d}  n_batch = n_ubatch {n_batch:5d}  eval callback {'on ' if callback else 'off'}  "
              f"median step {ms:6.1f} ms")


if __name__ == "__main__":
    main()
