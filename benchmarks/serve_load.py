"""Throughput and latency of `adalayers serve` under 1, 8 and 32 concurrent clients, with and without batching.

Starts the server itself (a subprocess on 127.0.0.1), waits for /health, then for each setting runs
closed-loop clients (each sends a request, waits for the answer, sends the next) over real HTTP
(httpx, async) until the time or request budget is spent, and stops the server.

    "batching":    --max-batch 32 --max-wait-ms 5 (concurrent requests share a base pass)
    "no batching": --max-batch 1  --max-wait-ms 0 (one request per base pass)

Without --heads it builds untrained heads shaped like configs/cola.yaml (sequence) and a CoNLL token
head in a temporary folder: weights do not change the work, and the numbers are for timing only.
Each request carries one real CoLA sentence.

    python benchmarks/serve_load.py --clients 1 8 32 --seconds 20 --max-requests 400
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from adalayers.store.run import atomic_write, write_json  # noqa: E402
from adalayers.lab.portable import data_setting  # noqa: E402
from adalayers.data.tasks.fetch import data_folder  # noqa: E402

SETTINGS = {"batching": ["--max-batch", "32", "--max-wait-ms", "5"],
            "no batching": ["--max-batch", "1", "--max-wait-ms", "0"]}


def untrained_heads(base: str, folder: Path) -> list[str]:
    from adalayers.store import run as runlib
    from adalayers.model.backbone import Backbone
    from adalayers.config import Config
    from adalayers.model.sidetask import SideTask

    backbone = Backbone.load(base)
    runs = []
    for name, kind, labels in [("cola", "sequence", ["unacceptable", "acceptable"]),
                               ("conll", "token", ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC",
                                                   "B-MISC", "I-MISC"])]:
        cfg = Config()
        cfg.head.kind, cfg.model.base, cfg.model.max_length = kind, base, 64
        task = SideTask(cfg, backbone.num_layers, backbone.hidden_size, labels)
        (folder / name).mkdir(parents=True)
        runlib.save_config(folder / name, cfg, labels, backbone, runlib.save_head(folder / name, task))
        runs.append(str(folder / name))
    return runs


def sentences(data: Path, n: int = 500) -> list[str]:
    path = data / "glue" / "CoLA" / "dev.tsv"
    if not path.is_file():
        sys.exit(f"CoLA not found at {path} (give --data)")
    return [line.split("\t")[3] for line in path.read_text(encoding="utf-8").splitlines()[:n]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def load(url: str, clients: int, texts: list[str], seconds: float, max_requests: int) -> dict:
    latencies, errors, sent = [], 0, 0
    stop_at = time.perf_counter() + seconds

    async def client(c: httpx.AsyncClient, who: int):
        nonlocal errors, sent
        i = who
        while time.perf_counter() < stop_at and sent < max_requests:
            sent += 1
            t0 = time.perf_counter()
            r = await c.post("/predict", json={"texts": [texts[i % len(texts)]], "base": False})
            if r.status_code == 200:
                latencies.append(time.perf_counter() - t0)
            else:
                errors += 1
            i += clients

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as c:
        before = (await c.get("/health")).json()["batches_run"]
        t0 = time.perf_counter()
        await asyncio.gather(*[client(c, k) for k in range(clients)])
        wall = time.perf_counter() - t0
        health = (await c.get("/health")).json()
    lat = sorted(latencies)
    q = statistics.quantiles(lat, n=100, method="inclusive") if len(lat) > 1 else lat * 99
    return {"clients": clients, "requests": len(lat), "errors": errors, "seconds": round(wall, 2),
            "requests_per_s": len(lat) / wall, "p50_ms": 1000 * statistics.median(lat) if lat else None,
            "p99_ms": 1000 * q[98] if lat else None, "batches_run": health["batches_run"] - before}


def start_server(base: str, heads: list[str], threads: int, flags: list[str], log, timeout: float = 120) -> tuple:
    """Start `adalayers serve` on a free loopback port and wait for /health; returns (process, url)."""
    port = free_port()
    cmd = [sys.executable, "-m", "adalayers.cli", "serve", "--base", base, "--heads", *heads,
           "--port", str(port), "--threads", str(threads), *flags]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    server = subprocess.Popen(cmd, env=env, stdout=log, stderr=log)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + timeout
    while time.time() < deadline:
        if server.poll() is not None:
            sys.exit(f"server exited with code {server.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return server, url
        except httpx.HTTPError:
            time.sleep(0.3)
    server.kill()
    sys.exit(f"server did not answer /health within {timeout:.0f} s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="minilm-l6")
    ap.add_argument("--heads", nargs="*", help="run folders (default: untrained heads, timing only)")
    ap.add_argument("--clients", type=int, nargs="+", default=[1, 8, 32])
    ap.add_argument("--seconds", type=float, default=20.0, help="time budget per (setting, clients)")
    ap.add_argument("--max-requests", type=int, default=400, help="request budget per (setting, clients)")
    ap.add_argument("--threads", type=int, default=1, help="the server's torch threads")
    ap.add_argument("--data", default=str(data_folder(None)), help="the data folder (default: $ADALAYERS_DATA, else ../shared/data)")
    ap.add_argument("--out", default="benchmarks/results/serve_load")
    args = ap.parse_args()
    settings = {k: v for k, v in vars(args).items() if k not in ("out",)}
    settings["data"] = data_setting(args.data, ROOT)  # the data folder as $ADALAYERS_DATA
    settings["python"], settings["machine"] = platform.python_version(), platform.machine()
    print("settings:", json.dumps(settings), flush=True)
    texts = sentences(Path(args.data))
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        heads = args.heads or untrained_heads(args.base, Path(tmp))
        for name, flags in SETTINGS.items():
            server, url = start_server(args.base, heads, args.threads, flags, subprocess.DEVNULL)
            try:
                asyncio.run(load(url, 1, texts, 2.0, 5))  # warm-up
                for n in args.clients:
                    r = asyncio.run(load(url, n, texts, args.seconds, args.max_requests))
                    r["setting"] = name
                    results.append(r)
                    print(f"{name:12s} clients {n:3d}: {r['requests_per_s']:.1f} req/s  p50 {r['p50_ms']:.0f} ms  "
                          f"p99 {r['p99_ms']:.0f} ms  ({r['requests']} requests, {r['errors']} errors, "
                          f"{r['seconds']} s)", flush=True)
            finally:
                server.terminate()
                try:
                    server.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    server.kill()
    lines = [f"### adalayers serve on {args.base}, CPU, {args.threads} torch thread(s); one CoLA sentence per request, "
             f"heads: {'given' if args.heads else 'untrained cola-shaped sequence + conll-shaped token'}", "",
             "| setting | clients | requests/s | p50 ms | p99 ms | requests | base passes |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['setting']} | {r['clients']} | {r['requests_per_s']:.1f} | {r['p50_ms']:.0f} | "
                     f"{r['p99_ms']:.0f} | {r['requests']} | {r['batches_run']} |")
    write_json(Path(args.out + ".json"), {"settings": settings, "results": results})
    atomic_write(Path(args.out + ".md"), "\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {args.out}.json and {args.out}.md")


if __name__ == "__main__":
    main()
