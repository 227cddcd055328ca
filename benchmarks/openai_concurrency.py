"""Concurrent streaming clients on the OpenAI-compatible route: aggregate tokens/s and time to first token,
without and with continuous batching, in one run.

`adalayers serve` runs in a subprocess (uvicorn, 127.0.0.1) on the base with N side-task heads (configs/
cola.yaml's settings, freshly initialised weights: the work does not depend on the weights), once with
--no-continuous-batching ("before": each request decodes alone, requests take turns between steps) and
once as it starts by default ("after": one scheduler, a new request's rows join the running batch between
decode steps); one server at a time. For each concurrency level C, C clients of the real `openai`
AsyncOpenAI client each stream one completion of --new tokens at once (greedy, every head asked through
the extra "adalayers" field, stream_options.include_usage for the token counts). Per level:

    tokens_per_s   all generated tokens (from usage) / wall time from the first request to the last [DONE]
    ttft_p50/p99   seconds from a client's request to its first chunk with text
    speedup        tokens_per_s / tokens_per_s of one client (same mode)
    ttft_p99_vs_1  ttft_p99 / the one-client TTFT (same mode): the prefill time of a lone request

    nice -n 10 python benchmarks/openai_concurrency.py --base gemma3-270m --heads 4 --clients 1,4,8,16 --new 24,128
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))

from adalayers import config as config_mod  # noqa: E402
from adalayers.store import run as runlib  # noqa: E402
from adalayers.model.backbone import Backbone  # noqa: E402
from adalayers.model.sidetask import SideTask  # noqa: E402
from runs_util import ServeProcess  # noqa: E402

PROMPTS = ["The history of the city begins in", "Write a short note to a friend about the weather:",
           "Three facts about the moon:", "The recipe needs flour, eggs and", "Once upon a time, a small robot",
           "The meeting is moved to Thursday because", "In this paper we show that", "Dear customer, your order"]


def head_folders(base: str, n: int, root: Path) -> list[Path]:
    """n run folders of fresh configs/cola.yaml heads on `base`, saved as training saves them."""
    backbone = Backbone.load(base)
    cfg = config_mod.load(ROOT / "configs" / "cola.yaml")
    cfg.model.base, labels, folders = base, ["unacceptable", "acceptable"], []
    for i in range(n):
        torch.manual_seed(i)
        task = SideTask(cfg, backbone.num_layers, backbone.hidden_size, labels, bos=backbone.adds_bos)
        folder = root / f"head{i}"
        folder.mkdir(parents=True)
        runlib.save_config(folder, cfg, labels, backbone, runlib.save_head(folder, task), task=folder.name,
                           kind="sequence")
        folders.append(folder)
    return folders


async def one_client(url: str, model: str, prompt: str, new: int, tasks: list[str]) -> tuple[float, int]:
    """(seconds to the first chunk with text, generated tokens) of one streamed completion."""
    import openai

    async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=3600) as client:
        t0, first, tokens = time.perf_counter(), None, 0
        stream = await client.completions.create(model=model, prompt=prompt, max_tokens=new, temperature=0,
                                                 stream=True, stream_options={"include_usage": True},
                                                 extra_body={"adalayers": {"tasks": tasks}})
        async for chunk in stream:
            if first is None and chunk.choices and chunk.choices[0].text:
                first = time.perf_counter() - t0
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        return first if first is not None else float("nan"), tokens


async def level(url: str, model: str, clients: int, new: int, tasks: list[str]) -> dict:
    t0 = time.perf_counter()
    got = await asyncio.gather(*[one_client(url, model, PROMPTS[i % len(PROMPTS)], new, tasks)
                                 for i in range(clients)])
    wall = time.perf_counter() - t0
    ttft = sorted(t for t, _ in got)
    tokens = sum(n for _, n in got)
    return {"clients": clients, "new": new, "tokens": tokens, "wall_s": round(wall, 3),
            "tokens_per_s": round(tokens / wall, 2), "ttft_p50_s": round(statistics.median(ttft), 3),
            "ttft_p99_s": round(ttft[min(len(ttft) - 1, int(0.99 * len(ttft)))], 3)}


def run_levels(url: str, model: str, mode: str, args) -> list[dict]:
    tasks = [f"head{i}" for i in range(args.heads)]
    asyncio.run(level(url, model, 1, 4, tasks))  # warm-up
    rows = []
    for new in map(int, args.new.split(",")):
        for clients in map(int, args.clients.split(",")):
            row = {"mode": mode, **asyncio.run(level(url, model, clients, new, tasks))}
            one = next((r for r in rows if r["new"] == new and r["clients"] == 1), row)
            row["speedup"] = round(row["tokens_per_s"] / one["tokens_per_s"], 2)
            row["ttft_p99_vs_1"] = round(row["ttft_p99_s"] / one["ttft_p50_s"], 2)
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="gemma3-270m")
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--clients", default="1,4,8,16")
    ap.add_argument("--new", default="24,128", help="new tokens per client (one table per value)")
    ap.add_argument("--threads", type=int, default=1, help="the server's torch threads")
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        heads = head_folders(args.base, args.heads, Path(tmp))
        for mode, flags in (("before", ["--no-continuous-batching"]), ("after", [])):
            server = ServeProcess(args.base, heads, Path(tmp), "--threads", str(args.threads), "--max-queue", "64",
                                  "--max-length", "512", *flags)
            try:
                server.wait_started()
                rows += run_levels(f"{server.url}/v1", Path(args.base).name, mode, args)
            finally:
                server.stop()
    settings = {"base": args.base, "heads": args.heads, "threads": args.threads, "torch": torch.__version__,
                "machine": platform.machine(), "cpus": os.cpu_count(), "decoding": "greedy",
                "route": "/v1/completions, stream, include_usage, every head asked"}
    print(json.dumps(settings))
    if args.out:
        runlib.write_json(Path(args.out), {"settings": settings, "rows": rows})


if __name__ == "__main__":
    main()
