"""Soak `adalayers serve`: 50 concurrent clients mixing good, bad and poison requests, over 127.0.0.1.

Each client loops over a fixed mix: valid requests, too many texts (413), a too-long text (413),
malformed JSON (422), an empty text (422) and an unknown task (400). The poison soak adds, in the
same loop, requests meant to hurt other clients:

    lone_surrogate     {"texts": ["x \\ud800"]}: valid JSON, not valid Unicode          -> 422
    nan                {"texts": [...], "base": NaN}                                    -> 422
    chunked_oversized  a chunked body (no Content-Length) sent until the server stops it -> 413, or a
                       reset: the server answers 413 and closes while the client is still sending, and
                       TCP may then reset the connection before the client reads the 413
                       (at most --poison-body-mb MB are offered)
    abandoned          a whole heavy request (16 texts x 2000 characters), then a hang-up -> none (dropped)
    slow_client        headers one byte every 0.5 s                                    -> 408 (read timeout)

Two soaks run on one server, side by side: the plain mix, then the mix with poison; the valid
requests' p50/p99 latency of the poison soak is reported as a ratio to the plain soak's.
Bounded by --seconds and --max-requests per soak; it starts and stops its own server. Pass criteria
(printed, exit code 1 if not met): no 5xx answer, every valid request answered 200, every bad or
poison request gets its expected answer, and the server's resident memory at the end is within 10%
of its memory after warm-up.

    python benchmarks/soak_poison.py --clients 50 --seconds 60
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

MAX_TEXTS, MAX_CHARS, READ_TIMEOUT = 16, 2000, 10


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


def poison_mix(texts: list[str]) -> list[tuple[str, dict, int | str | tuple]]:
    """Poison requests, interleaved with the plain mix (one after every two of its entries)."""
    heavy = json.dumps({"texts": [(" ".join(texts) * 3)[:MAX_CHARS]] * MAX_TEXTS}).encode()
    return [
        ("lone_surrogate", {"content": b'{"texts": ["x \\ud800"]}', "headers": {"content-type": "application/json"}},
         422),
        ("nan", {"content": ('{"texts": ["%s"], "base": NaN}' % texts[0].replace('"', "")).encode(),
                 "headers": {"content-type": "application/json"}}, 422),
        ("chunked_oversized", {"raw": "chunked"}, (413, "reset")),
        ("abandoned", {"raw": "abandon", "body": heavy}, "dropped"),
        ("slow_client", {"raw": "slow"}, 408),
    ]


def interleave(plain: list, poison: list) -> list:
    out, k = [], 0
    for i, entry in enumerate(plain):
        out.append(entry)
        if i % 2 == 1 and k < len(poison):
            out.append(poison[k])
            k += 1
    return out + poison[k:]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def _status(reader: asyncio.StreamReader, limit_s: float) -> int | str:
    try:
        line = await asyncio.wait_for(reader.readline(), limit_s)
    except asyncio.TimeoutError:
        return "no answer"
    except ConnectionError:
        return "reset"
    if not line:
        return "closed"
    parts = line.split()
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else "closed"


async def raw_request(url: str, how: str, body: bytes = b"", max_mb: float = 64) -> int | str:
    """A request httpx will not send: a chunked body without end, a hang-up, a dribble of header bytes.
    The answer is read while sending (a server that answers early and closes would otherwise reset it away)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    answer = asyncio.create_task(_status(reader, 120))
    try:
        if how == "chunked":
            writer.write(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n")
            chunk = b'{"texts": ["' + b"a" * (64 * 1024) + b'"], '
            frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
            pace = 0.0
        elif how == "slow":
            frame, pace = None, 0.5
            data = b"POST /predict HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"y" * 100
        elif how == "abandon":
            writer.write(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                         b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()
            await asyncio.sleep(0.05)
            answer.cancel()
            return "dropped"
        else:
            raise ValueError(how)
        try:
            for i in range(int(max_mb * 16) if frame else len(data)):
                if answer.done():
                    break
                writer.write(frame if frame else data[i:i + 1])
                await writer.drain()
                await asyncio.sleep(pace)
        except ConnectionError:
            pass
        return await answer
    finally:
        answer.cancel()
        writer.close()
        try:
            await writer.wait_closed()
        except ConnectionError:
            pass


async def soak(url: str, clients: int, seconds: float, max_requests: int, mix, max_mb: float = 64) -> dict:
    codes, by_kind = collections.Counter(), collections.defaultdict(collections.Counter)
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
            if "raw" in kwargs:
                status, text = await raw_request(url, kwargs["raw"], kwargs.get("body", b""), max_mb), ""
            else:
                try:
                    r = await c.post("/predict", **kwargs)
                    status, text = r.status_code, r.text
                except httpx.HTTPError as e:
                    status, text = type(e).__name__, str(e)
            latencies[kind].append(time.perf_counter() - t0)
            codes[status] += 1
            by_kind[kind][status] += 1
            if status not in (expected if isinstance(expected, tuple) else (expected,)):
                wrong.append(f"{kind}: expected {expected}, got {status} {text[:200]}")
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
    return {"requests": sum(codes.values()), "seconds": round(wall, 1),
            "codes": {str(k): v for k, v in sorted(codes.items(), key=str)},
            "codes_by_kind": {k: {str(s): n for s, n in sorted(v.items(), key=str)} for k, v in sorted(by_kind.items())},
            "wrong": wrong[:20], "n_wrong": len(wrong),
            "valid_failed": sum(n for s, n in by_kind["valid"].items() if s != 200),
            "p50_ms": 1000 * statistics.median(all_lat), "p99_ms": 1000 * q[98],
            "valid_p50_ms": 1000 * statistics.median(valid), "valid_p99_ms": 1000 * qv[98],
            "by_kind": {k: len(v) for k, v in sorted(latencies.items())}}


def _table(title: str, rows: list[tuple[str, dict]], baseline: dict) -> list[str]:
    lines = [title, "",
             "| soak | requests | answers by code | wrong answer | valid not 200 | p50 / p99 ms (valid) "
             "| valid p50 / p99 vs plain |", "|---|---:|---|---:|---:|---|---|"]
    for name, r in rows:
        lines.append(f"| {name} | {r['requests']} | {', '.join(f'{k}: {v}' for k, v in r['codes'].items())} | "
                     f"{r['n_wrong']} | {r['valid_failed']} | {r['valid_p50_ms']:.0f} / {r['valid_p99_ms']:.0f} | "
                     f"{r['valid_p50_ms'] / baseline['valid_p50_ms']:.2f} / "
                     f"{r['valid_p99_ms'] / baseline['valid_p99_ms']:.2f} |")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="minilm-l6")
    ap.add_argument("--heads", nargs="*", help="run folders (default: untrained cola- and conll-shaped heads)")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=60.0, help="time budget of each soak (plain, poison)")
    ap.add_argument("--max-requests", type=int, default=20000, help="request budget of each soak")
    ap.add_argument("--poison-body-mb", type=float, default=64, help="most MB one chunked poison body offers")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "soak_poison"))
    args = ap.parse_args()
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    settings.update(max_texts=MAX_TEXTS, max_chars=MAX_CHARS, read_timeout_s=READ_TIMEOUT)
    print("settings:", json.dumps(settings), flush=True)
    texts = sentences(Path(args.data))
    flags = ["--max-batch", "32", "--max-wait-ms", "5", "--max-texts", str(MAX_TEXTS), "--max-chars", str(MAX_CHARS),
             "--read-timeout", str(READ_TIMEOUT)]
    with tempfile.TemporaryDirectory() as tmp, open(Path(tmp) / "server.log", "w") as log:
        heads = args.heads or untrained_heads(args.base, Path(tmp))
        server, url = start_server(args.base, heads, args.threads, flags, log, timeout=600)  # a busy machine
        try:
            mix = requests_mix(texts, httpx.get(f"{url}/tasks").json()["tasks"][0]["name"])
            poisoned = interleave(mix, poison_mix(texts))
            asyncio.run(soak(url, args.clients, 10.0, 500, mix))  # warm-up: plain traffic, 10 s
            rss = {"after_warmup_mb": rss_mb(server.pid)}
            plain = asyncio.run(soak(url, args.clients, args.seconds, args.max_requests, mix))
            rss["after_plain_mb"] = rss_mb(server.pid)
            poison = asyncio.run(soak(url, args.clients, args.seconds, args.max_requests, poisoned,
                                      args.poison_body_mb))
            rss["end_mb"] = rss_mb(server.pid)
            health = httpx.get(f"{url}/health").json()
        finally:
            server.terminate()
            server.wait(timeout=30)
    rss = {k: round(v, 1) for k, v in rss.items()}
    rss["growth_pct"] = round(100 * (rss["end_mb"] - rss["after_warmup_mb"]) / rss["after_warmup_mb"], 2)
    fivexx = sum(n for r in (plain, poison) for code, n in r["codes"].items() if code.isdigit() and int(code) >= 500)
    ratio = {"valid_p50": round(poison["valid_p50_ms"] / plain["valid_p50_ms"], 3),
             "valid_p99": round(poison["valid_p99_ms"] / plain["valid_p99_ms"], 3)}
    passed = (fivexx == 0 and plain["n_wrong"] == poison["n_wrong"] == 0
              and plain["valid_failed"] == poison["valid_failed"] == 0 and abs(rss["growth_pct"]) <= 10)
    result = {"plain": plain, "poison": poison, "poison_vs_plain": ratio, "rss": rss, "fivexx": fivexx,
              "server_health_at_end": health, "passed": passed}
    lines = _table(f"### Soak: {args.clients} clients, {args.seconds:g} s per soak, {args.base}, "
                   f"heads {', '.join(Path(h).name for h in heads)}, CPU {args.threads} thread(s)",
                   [("plain", plain), ("with poison", poison)], plain)
    lines += ["", "| poison soak: kind | answers |", "|---|---|"]
    lines += [f"| {k} | {', '.join(f'{s}: {n}' for s, n in v.items())} |" for k, v in poison["codes_by_kind"].items()]
    lines += ["", f"Server RSS: {rss['after_warmup_mb']:.0f} MB after warm-up, {rss['after_plain_mb']:.0f} MB after "
                  f"the plain soak, {rss['end_mb']:.0f} MB at the end ({rss['growth_pct']:+.1f}%); 5xx answers: "
                  f"{fivexx}; requests dropped unrun (client gone): {health['requests_dropped']}."]
    write_json(Path(args.out + ".json"), {"settings": settings, "result": result})
    atomic_write(Path(args.out + ".md"), "\n".join(lines) + "\n")
    print("\n".join(lines))
    print("PASSED" if passed else f"FAILED: {(plain['wrong'] + poison['wrong'])[:5]}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
