"""Soak `adalayers serve`: 50 concurrent clients for 60 s mixing good and bad requests, over 127.0.0.1.

Each client loops over a fixed mix: valid requests, too many texts (413), a too-long text (413),
malformed JSON (422), an empty text (422) and an unknown task (400). Bounded by --seconds and
--max-requests; it starts and stops its own server. Pass criteria (printed, exit code 1 if not met):
no 5xx answer, every bad request gets its expected 4xx, and the server's resident memory at the end
is within 10% of its memory after warm-up (the whole process tree: with --engine ray, the driver, Ray's
daemons and the replicas).

    python benchmarks/soak.py --clients 50 --seconds 60
    python benchmarks/soak.py --engine ray --replicas 2 --out benchmarks/results/soak_ray2   # Ray Serve
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import ROOT, sentences, start_server, untrained_heads  # noqa: E402

from adalayers.run import atomic_write, write_json  # noqa: E402

MAX_TEXTS, MAX_CHARS = 16, 2000


def requests_mix(texts: list[str], task: str) -> list[tuple[str, dict, int]]:
    """(kind, httpx request kwargs, expected status); `task` is one the server knows."""
    return [
        ("valid", {"json": {"texts": texts[:3]}}, 200),
        ("valid", {"json": {"texts": texts[3:4], "tasks": [task]}}, 200),
        ("too_many_texts", {"json": {"texts": texts[:MAX_TEXTS + 1]}}, 413),
        ("too_long_text", {"json": {"texts": ["word " * (MAX_CHARS // 4)]}}, 413),
        ("malformed_json", {"content": b'{"texts": ["unclosed', "headers": {"content-type": "application/json"}}, 422),
        ("empty_text", {"json": {"texts": ["   "]}}, 422),
        ("unknown_task", {"json": {"texts": texts[:1], "tasks": ["sentiment-xyz"]}}, 400),
        ("valid", {"json": {"texts": texts[5:13]}}, 200),
    ]


def rss_mb(pid: int) -> float:
    """Resident memory of the server's process tree (one process for uvicorn; Ray's processes for Ray Serve)."""
    import psutil

    total, root = 0, psutil.Process(pid)
    for p in [root, *root.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


async def soak(url: str, clients: int, seconds: float, max_requests: int, mix) -> dict:
    codes = collections.Counter()
    wrong: list[str] = []
    latencies = collections.defaultdict(list)
    sent = 0
    stop_at = time.perf_counter() + seconds

    async def client(c: httpx.AsyncClient, who: int):
        nonlocal sent
        i = who
        while time.perf_counter() < stop_at and sent < max_requests:
            sent += 1
            kind, kwargs, expected = mix[i % len(mix)]
            t0 = time.perf_counter()
            r = await c.post("/predict", **kwargs)
            latencies[kind].append(time.perf_counter() - t0)
            codes[r.status_code] += 1
            if r.status_code != expected:
                wrong.append(f"{kind}: expected {expected}, got {r.status_code} {r.text[:200]}")
            i += 1

    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits) as c:
        t0 = time.perf_counter()
        await asyncio.gather(*[client(c, k) for k in range(clients)])
        wall = time.perf_counter() - t0
    all_lat = sorted(x for v in latencies.values() for x in v)
    q = statistics.quantiles(all_lat, n=100, method="inclusive")
    valid = sorted(latencies["valid"])
    qv = statistics.quantiles(valid, n=100, method="inclusive")
    return {"requests": sum(codes.values()), "seconds": round(wall, 1), "codes": dict(sorted(codes.items())),
            "wrong": wrong[:20], "n_wrong": len(wrong),
            "p50_ms": 1000 * statistics.median(all_lat), "p99_ms": 1000 * q[98],
            "valid_p50_ms": 1000 * statistics.median(valid), "valid_p99_ms": 1000 * qv[98],
            "by_kind": {k: len(v) for k, v in sorted(latencies.items())}}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="minilm-l6")
    ap.add_argument("--heads", nargs="*", help="run folders (default: untrained cola- and conll-shaped heads)")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--max-requests", type=int, default=20000)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--engine", default="uvicorn", choices=["uvicorn", "ray"], help="serve --engine")
    ap.add_argument("--replicas", type=int, default=1, help="serve --replicas (--engine ray)")
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "soak"))
    args = ap.parse_args()
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    settings.update(max_texts=MAX_TEXTS, max_chars=MAX_CHARS)
    print("settings:", json.dumps(settings), flush=True)
    texts = sentences(Path(args.data))
    flags = ["--max-batch", "32", "--max-wait-ms", "5", "--max-texts", str(MAX_TEXTS), "--max-chars", str(MAX_CHARS),
             "--engine", args.engine] + (["--replicas", str(args.replicas)] if args.engine == "ray" else [])
    with tempfile.TemporaryDirectory() as tmp, open(Path(tmp) / "server.log", "w") as log:
        heads = args.heads or untrained_heads(args.base, Path(tmp))
        server, url = start_server(args.base, heads, args.threads, flags, log, timeout=600)
        try:
            mix = requests_mix(texts, httpx.get(f"{url}/tasks").json()["tasks"][0]["name"])
            asyncio.run(soak(url, args.clients, 10.0, 500, mix))  # warm-up: same traffic, 10 s
            rss_warm = rss_mb(server.pid)
            result = asyncio.run(soak(url, args.clients, args.seconds, args.max_requests, mix))
            rss_end = rss_mb(server.pid)
        finally:
            server.terminate()
            server.wait(timeout=180)  # Ray Serve drains its replicas and stops Ray first
    result.update(rss_after_warmup_mb=round(rss_warm, 1), rss_end_mb=round(rss_end, 1),
                  rss_growth_pct=round(100 * (rss_end - rss_warm) / rss_warm, 2))
    fivexx = sum(n for code, n in result["codes"].items() if code >= 500)
    result["passed"] = fivexx == 0 and result["n_wrong"] == 0 and abs(result["rss_growth_pct"]) <= 10
    engine = "uvicorn" if args.engine == "uvicorn" else f"Ray Serve, {args.replicas} replica(s)"
    lines = [f"### Soak ({engine}): {args.clients} clients, {result['seconds']} s, {args.base}, CPU {args.threads} "
             f"thread(s)", "",
             "| requests | req/s | answers by code | wrong code | p50 / p99 ms (all) | p50 / p99 ms (valid) | RSS after warm-up → end |",
             "|---:|---:|---|---:|---|---|---|",
             f"| {result['requests']} | {result['requests'] / result['seconds']:.1f} | {', '.join(f'{k}: {v}' for k, v in result['codes'].items())} | "
             f"{result['n_wrong']} | {result['p50_ms']:.0f} / {result['p99_ms']:.0f} | "
             f"{result['valid_p50_ms']:.0f} / {result['valid_p99_ms']:.0f} | {result['rss_after_warmup_mb']:.0f} → "
             f"{result['rss_end_mb']:.0f} MB ({result['rss_growth_pct']:+.1f}%) |"]
    write_json(Path(args.out + ".json"), {"settings": settings, "result": result})
    atomic_write(Path(args.out + ".md"), "\n".join(lines) + "\n")
    print("\n".join(lines))
    print("PASSED" if result["passed"] else f"FAILED: {result['wrong'][:5]}")
    return 0 if result["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
