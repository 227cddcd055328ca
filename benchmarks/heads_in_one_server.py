"""The heads' cost inside one server process: requests with the heads and without them, alternating.

benchmarks/llm_server.py compares two servers, one started without heads and one with them, so its ratio also
holds whatever differs between two processes started minutes apart on a shared machine. Here one
`adalayers serve --runtime llama.cpp` with the four heads (llm_server.py's `adalayers+4heads`, the same command)
answers pairs of cells of C concurrent completions: one asking every head, the last one as a per-step guard whose
threshold is never reached (llm_server.extra_body's), the other asking `tasks: []` (no state read), their order
alternating from pair to pair. Per pair: tokens/s with the heads over without; then the median over the pairs, and
the same for the inter-token p50 and the time to first token p50.

    python benchmarks/heads_in_one_server.py --base gemma3-270m --threads 2 --clients 1,4 --pairs 6 \\
        --heads-dir runs/llm_server_top17 --mixers --pip-libs

--prompts benchmark: llm_server.py's prompts (LENGTHS tokens of CoLA's text, 128, 512, 16 and 256 for 4 clients);
--prompts short: its warm-up prompt's kind, one sentence of about 10 tokens each.
"""
from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import llm_server  # noqa: E402
from llm_server_load import run_cell  # noqa: E402

SHORT = ["The history of the city begins in the north, where", "Write a short note to a friend about the weather:",
         "Three facts about the moon: first, it", "The recipe needs flour, eggs and milk, then",
         "Once upon a time, a small robot", "The meeting is moved to Thursday because",
         "In this paper we show that", "Dear customer, your order"]


def pairs(url: str, model: str, prompts: list[str], extra: dict, n: int, new: int) -> dict:
    """n pairs of cells (heads, none), the order alternating: per pair the ratios, then their medians."""
    none = {k: v for k, v in extra.items() if k != "adalayers"} | {"adalayers": {"tasks": []}}
    cells: dict[str, list[dict]] = {"heads": [], "none": []}
    for i in range(n):
        for name in ("heads", "none") if i % 2 == 0 else ("none", "heads"):
            c = run_cell(f"{url}/v1", model, prompts, new, extra if name == "heads" else none, 900)
            if c["errors"]:
                raise SystemExit(f"{name}: {c['errors'][0]}")
            cells[name].append({k: c[k] for k in ("tokens_per_s", "itl_p50", "ttft_p50", "tokens")})
    ratio = {k: [h[k] / o[k] for h, o in zip(cells["heads"], cells["none"])]
             for k in ("tokens_per_s", "itl_p50", "ttft_p50")}
    return {"cells": cells, "ratios": ratio, **{f"{k}_ratio_median": round(statistics.median(v), 4)
                                                for k, v in ratio.items()}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--base", default="gemma3-270m")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--clients", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4])
    p.add_argument("--pairs", type=int, default=6)
    p.add_argument("--new", type=int, default=128)
    p.add_argument("--prompts", choices=["benchmark", "short"], default="benchmark")
    p.add_argument("--heads-dir", type=Path, default=ROOT / "runs" / "llm_server")
    p.add_argument("--mixers", action="store_true", help="each run folder's mixer head (llm_server.py's --mixers)")
    p.add_argument("--ctx-size", type=int, default=16384)
    p.add_argument("--start-timeout", type=float, default=600)
    p.add_argument("--pip-libs", action="store_true", help="llama-cpp-python's own llama.cpp (llm_server.py's)")
    p.add_argument("--out", type=Path, default=None, help="a JSON file of every cell (default: printed only)")
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    llm_server.LIBS["dir"] = None if args.pip_libs else llm_server.BUILD
    heads = [args.heads_dir / args.base / h / ("candidates/head" if args.mixers else "") for h in llm_server.HEADS]
    missing = [h for h in heads if not (h / "config.json").is_file()]
    if missing:
        sys.exit(f"no trained head in {missing[0]}: run `python benchmarks/llm_server.py train-heads --base {args.base}`")
    # llm_server.command's settings: the server as its adalayers+4heads runs it
    args.threads_now, args.batch_size, args.no_repack = args.threads, None, False
    args.lengths = list(llm_server.LENGTHS)
    logdir = args.heads_dir / "logs"
    logdir.mkdir(parents=True, exist_ok=True)
    proc, url, _, logf = llm_server.start("adalayers+4heads", args, heads, logdir)
    try:
        model = llm_server.httpx.get(f"{url}/v1/models", timeout=10).json()["data"][0]["id"]
        extra = llm_server.extra_body("adalayers+4heads", url, model, heads, args.new)
        results = {"settings": {**{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                                "command": " ".join(sys.argv)}, "cells": {}}
        for c in args.clients:
            prompts = (llm_server.prompts_for(args.base, args.lengths, [c])[c] if args.prompts == "benchmark"
                       else (SHORT * c)[:c])
            row = pairs(url, model, prompts, extra, args.pairs, args.new)
            results["cells"][str(c)] = row
            print(json.dumps({"clients": c, **{k: v for k, v in row.items() if k.endswith("_median")},
                              "tokens_per_s_ratios": [round(x, 3) for x in row["ratios"]["tokens_per_s"]]}),
                  flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
        logf.close()
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
