"""Soak `adalayers serve`: 50 concurrent clients mixing good, bad and (--poison) poison requests, over 127.0.0.1.

Each client loops over a fixed mix: valid requests, too many texts (413), a too-long text (413),
malformed JSON (422), an empty text (422) and an unknown task (400). With --poison, a second phase
runs the same mix with requests meant to hurt other clients interleaved (one after every two):

    lone_surrogate     {"texts": ["x \\ud800"]}: valid JSON, not valid Unicode            -> 422
    nan, infinity, 1e999  a non-finite number in the JSON (NaN, Infinity, an overflowing 1e999) -> 422
    chunked_oversized  a chunked body (no Content-Length) sent until the server stops it  -> 413, or a
                       reset: the server answers 413 and closes while the client is still sending, and
                       TCP may then reset the connection before the client reads the 413
                       (at most --poison-body-mb MB are offered)
    abandoned          a whole heavy request (max-texts texts of max-chars characters), then a hang-up
                       -> none: the server should drop it unrun (its /health `clients_gone`)
    slow_client        headers one byte every 0.5 s                    -> 408 (--read-timeout)
    no_body            headers with a Content-Length, then the body never comes -> 408 (--read-timeout)
    deep_json          {"texts": [[[...]]]} nested 500 deep (JSON parsers recurse)  -> 422
    surrogate_task     a task name with a lone surrogate (the 400 must still be encodable) -> 400
    mixed_oversize     max-texts texts of max-chars characters for the sequence head alone, batched with
                       the plain mix's token-head requests: no windows for it, so cheap -> 200
    abandoned_generate (--generate, a decoder LLM base) POST /generate of max-texts prompts x 64 tokens,
                       then a hang-up -> none: stopped at the next decode step (/health `generations_stopped`)
    wide_array         {"texts": [1, 1, ... 100,000 times]} (0.2 MB)  -> 413 before parsing (issue 56: a 21.6 MB 422)
    wide_object        an unknown field holding an object of 60,000 keys -> 413 before parsing
    huge_conversation  (--generate) /v1/chat/completions with 20,000 one-word messages -> 413 before templating
    burst              (one client in four) 8 concurrent requests of 2 texts longer than max_length, for the
                       sequence head alone -> 200 or 503 (issue 56: a shared tokenizer gave a 500 under load)

--storm-clients N adds a third phase, "storm": the valid requests of the plain mix while N more clients
send heavy bodies (max-texts texts of max-chars characters) and hang up 0.05-0.3 s after sending
(issue 56: one valid answer in 18 s with 40 of them), from a process of their own (as the issue's valid client
was in another process than the storm: this process's times are then not its own storm's load). Its valid
p50/p99 are reported against the plain phase's, like the poison phase's.

Each client has connections of its own (as many as its largest burst) and names itself (X-Client-Id: soak-N),
as distinct clients off loopback have distinct addresses: the server takes turns between clients
(serve/batcher.py). The storm's requests carry no name: all of them one client, their address.

One invocation, one server: a warm-up (the most varied mix of the run, so every request kind and
batch shape has been seen once), then --rounds rounds of the plain phase and, with --poison, the
poison phase right after it, side by side, so the valid requests' p50/p99 latency with poison is
a ratio to the plain phase's measured on the same machine minutes apart. The server's resident
memory (its whole process tree: with --engine ray the driver, Ray's daemons and the replicas) is
sampled every --rss-every seconds from start to end. Every phase is bounded by --seconds and
--max-requests, every poison body by --poison-body-mb. It starts and stops its own server.

After every phase the server's own /health gives its C heap (serve/memory.py): bytes in use, and
bytes freed but kept by the allocator. Resident memory that grows while the heap in use stays flat is
the allocator keeping freed memory (fragmentation), not a leak.

Pass criteria (printed, exit code 1 if not met): no 5xx answer, every valid request answered 200,
every bad or poison request its expected answer, and no leak: the server's C heap in use at the end
at most --max-heap-growth-pct above its value after the warm-up (where /health reports no heap, off
glibc, the resident memory instead). Resident memory is reported, not bounded: it also holds what
the allocator keeps after the largest transient peak. With --rounds >= 2 the growth of each round
is reported too: growth that stops after the first round is warm-up, growth that goes on is a leak.

    python benchmarks/soak.py --clients 50 --seconds 60 --poison
    python benchmarks/soak.py --engine ray --replicas 2 --out benchmarks/results/soak_ray2   # Ray Serve
    python benchmarks/soak.py --base gemma3-270m --runtime llama.cpp --generate --poison --storm-clients 40
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import json
import multiprocessing
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))
from serve_load import ROOT, sentences, start_server, untrained_heads  # noqa: E402

from adalayers.store.run import atomic_write, write_json  # noqa: E402
from adalayers.lab.portable import data_setting  # noqa: E402
from adalayers.data.tasks.fetch import data_folder  # noqa: E402

MAX_TEXTS, MAX_CHARS = 16, 2000
# the clients drop a connection idle this long, sooner than the server's --keep-alive (5 s): a client that
# reuses a connection the server is closing at that moment gets a reset (HTTP's keep-alive race)
KEEPALIVE_EXPIRY_S = 2.0
Expected = int | str | tuple


def requests_mix(texts: list[str], task: str) -> list[tuple[str, dict, Expected]]:
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


def poison_mix(texts: list[str], sequence_task: str, generate: bool = False) -> list[tuple[str, dict, Expected]]:
    """Poison requests, interleaved with the plain mix (one after every two of its entries)."""
    long = (" ".join(texts) * 3)[:MAX_CHARS]
    heavy = json.dumps({"texts": [long] * MAX_TEXTS}).encode()
    one = json.dumps(texts[0])
    prompts = json.dumps({"prompts": [long[:200]] * MAX_TEXTS, "max_new_tokens": 64}).encode()

    def raw_json(body: str) -> dict:
        return {"content": body.encode(), "headers": {"content-type": "application/json"}}

    wide = b'{"texts": [' + b",".join([b"1"] * 100_000) + b"]}"
    keys = b'{"texts": [%s], "junk": {' % one.encode() + b",".join(b'"k%d": 1' % i for i in range(60_000)) + b"}}"
    chat = json.dumps({"model": "m", "messages": [{"role": "user", "content": "hi"}] * 20_000}).encode()
    burst = {"texts": [("ab " * 666)] * 2, "tasks": [sequence_task], "base": False}  # under --max-chars, past max_length
    return [
        ("wide_array", {"content": wide, "headers": {"content-type": "application/json"}}, 413),
        ("burst", {"burst": 8, "json": burst}, (200, 503)),
        ("wide_object", {"content": keys, "headers": {"content-type": "application/json"}}, 413),
    ] + ([("huge_conversation", {"content": chat, "headers": {"content-type": "application/json"},
                                 "path": "/v1/chat/completions"}, 413)] if generate else []) + [
        ("lone_surrogate", raw_json('{"texts": ["x \\ud800"]}'), 422),
        ("deep_json", raw_json('{"texts": ' + "[" * 500 + "]" * 500 + "}"), 422),
        ("nan", raw_json('{"texts": [%s], "base": NaN}' % one), 422),
        ("surrogate_task", raw_json('{"texts": [%s], "tasks": ["\\ud800"]}' % one), 400),
        ("chunked_oversized", {"raw": "chunked"}, (413, "reset")),
        ("mixed_oversize", {"json": {"texts": [long] * MAX_TEXTS, "tasks": [sequence_task]}}, 200),
        ("infinity", raw_json('{"texts": [%s], "tasks": [Infinity]}' % one), 422),
        ("abandoned", {"raw": "abandon", "body": heavy}, "dropped"),
    ] + ([("abandoned_generate", {"raw": "abandon", "body": prompts, "path": "/generate"}, "dropped")]
         if generate else []) + [
        ("1e999", raw_json('{"texts": [%s], "base": 1e999}' % one), 422),
        ("slow_client", {"raw": "slow"}, 408),
        ("no_body", {"raw": "no_body"}, 408),
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
    """Resident memory of the server's process tree (one process for uvicorn; Ray's processes for Ray Serve)."""
    import psutil

    total, root = 0, psutil.Process(pid)
    for p in [root, *root.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def heap_mb(url: str) -> dict | None:
    """The serving process's C heap from /health (serve/memory.py): bytes in use and bytes freed but kept.
    With --engine ray: one replica's."""
    memory = httpx.get(f"{url}/health", timeout=120).json().get("memory") or {}
    return {"rss": memory.get("rss_mb"), "in_use": memory.get("heap_in_use_mb"), "free": memory.get("heap_free_mb")}


class RssSampler(threading.Thread):
    """Samples rss_mb(pid) every `every` seconds into `samples` as (seconds since start, phase, MB)."""

    def __init__(self, pid: int, every: float):
        super().__init__(daemon=True)
        self.pid, self.every, self.phase, self.samples = pid, every, "start", []
        self._stop_event, self._t0 = threading.Event(), time.perf_counter()

    def sample(self) -> float:
        mb = rss_mb(self.pid)
        self.samples.append((round(time.perf_counter() - self._t0, 1), self.phase, round(mb, 1)))
        return mb

    def run(self) -> None:
        while not self._stop_event.wait(self.every):
            self.sample()

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


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


async def raw_request(url: str, how: str, body: bytes = b"", max_mb: float = 64, limit_s: float = 120,
                      path: str = "/predict", hang_up_s: float = 0.05) -> int | str:
    """A request httpx will not send: a chunked body without end, a hang-up, a dribble of header bytes, a
    body that never comes. The answer is read while sending (a server that answers early and closes would
    otherwise reset it away); nothing waits longer than `limit_s`."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    answer = asyncio.create_task(_status(reader, limit_s))
    head = b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    try:
        if how == "abandon":
            writer.write(head + b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
            await writer.drain()
            await asyncio.sleep(hang_up_s)
            return "dropped"
        if how == "no_body":
            writer.write(head + b"Content-Length: 100\r\n\r\n")
            await writer.drain()
            return await answer
        if how == "chunked":
            writer.write(head + b"Transfer-Encoding: chunked\r\n\r\n")
            chunk = b'{"texts": ["' + b"a" * (64 * 1024) + b'"], '
            pieces, pace = [f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"] * int(max_mb * 16), 0.0
        elif how == "slow":
            data = b"POST /predict HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"y" * 100
            pieces, pace = [data[i:i + 1] for i in range(len(data))], 0.5
        else:
            raise ValueError(how)
        try:
            for piece in pieces:
                if answer.done():
                    break
                writer.write(piece)
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


async def soak(url: str, clients: int, seconds: float, max_requests: int, mix, max_mb: float,
               storm_clients: int = 0, storm_body: bytes = b"") -> dict:
    """Closed-loop clients over `mix` until `seconds` or `max_requests`; the raw record of one phase."""
    by_kind = collections.defaultdict(collections.Counter)
    wrong: list[str] = []
    latencies = collections.defaultdict(list)
    spans: list[tuple[str, float, float]] = []  # (kind, start, end) of every request, seconds into the phase
    sent = 0
    begin = time.perf_counter()
    stop_at = begin + seconds

    async def client(who: int):
        # each client its own connections (at most a burst's): with one pool of `clients` connections for all,
        # a burst's 8 requests held 8 of them and other clients' requests waited here for one, a wait that
        # is this load generator's, not the server's
        # ... and its name (X-Client-Id), as distinct clients have distinct addresses off loopback: the server
        # shares its passes fairly between clients (serve/batcher.py)
        async with httpx.AsyncClient(base_url=url, timeout=120, limits=limits,
                                     headers={"X-Client-Id": f"soak-{who}"}) as c:
            await run(c, who)

    async def run(c: httpx.AsyncClient, who: int):
        nonlocal sent
        i = who
        while time.perf_counter() < stop_at and sent < max_requests:
            sent += 1
            kind, kwargs, expected = mix[i % len(mix)]
            t0 = time.perf_counter()
            if "raw" in kwargs:
                status, text = await raw_request(url, kwargs["raw"], kwargs.get("body", b""), max_mb,
                                                 path=kwargs.get("path", "/predict")), ""
            elif "burst" in kwargs:  # n copies at once; the worst answer counts
                rs = await asyncio.gather(*(c.post("/predict", json=kwargs["json"]) for _ in range(kwargs["burst"])),
                                          return_exceptions=True)
                bad = [r for r in rs if isinstance(r, Exception) or r.status_code not in (200, 503)]
                status, text = ((type(bad[0]).__name__ if isinstance(bad[0], Exception) else bad[0].status_code),
                                str(bad[0])[:200]) if bad else (rs[0].status_code, "")
            else:
                try:
                    kwargs = dict(kwargs)
                    r = await c.post(kwargs.pop("path", "/predict"), **kwargs)
                    status, text = r.status_code, r.text
                except httpx.HTTPError as e:
                    status, text = type(e).__name__, str(e)
            latencies[kind].append(time.perf_counter() - t0)
            spans.append((kind, t0 - begin, time.perf_counter() - begin))
            by_kind[kind][status] += 1
            if status not in (expected if isinstance(expected, tuple) else (expected,)):
                wrong.append(f"{kind}: expected {expected}, got {status} {text[:200]}")
            i += 1

    most = max([kw.get("burst", 1) for _, kw, _ in mix])
    limits = httpx.Limits(max_connections=most, max_keepalive_connections=most, keepalive_expiry=KEEPALIVE_EXPIRY_S)
    spawn = multiprocessing.get_context("spawn")
    storm, storm_count = None, spawn.Value("l", 0)
    if storm_clients:  # in a process of its own: the valid clients' times are not this process's own load
        storm = spawn.Process(target=storm_process, args=(url, storm_clients, storm_body, seconds, storm_count))
        storm.start()
    try:
        t0 = time.perf_counter()
        await asyncio.gather(*[client(k) for k in range(clients)])
        wall = time.perf_counter() - t0
    finally:
        if storm is not None:
            storm.join(timeout=30)
            if storm.is_alive():
                storm.terminate()
            by_kind["storm"]["dropped"] += storm_count.value
    return {"seconds": wall, "by_kind": by_kind, "latencies": latencies, "wrong": wrong, "spans": spans}


def storm_process(url: str, storm_clients: int, storm_body: bytes, seconds: float, count) -> None:
    """The storm (a process of its own, bounded by `seconds`): clients that send a heavy body and hang up 0.05-0.3 s
    later, again and again; `count` (a shared integer) gets the number sent."""
    async def main():
        stop_at = time.perf_counter() + seconds

        async def one(who: int):
            rng = random.Random(who)
            while time.perf_counter() < stop_at:
                await raw_request(url, "abandon", storm_body, path="/predict", hang_up_s=rng.uniform(0.05, 0.3))
                with count.get_lock():
                    count.value += 1
        await asyncio.gather(*[one(k) for k in range(storm_clients)])
    asyncio.run(main())


def slowest_valid(records: list[dict], n: int = 5) -> list[dict]:
    """The n slowest valid requests of a phase, each with the kinds of the requests in flight beside it."""
    valid = sorted(((b - a, a, b, r) for r in records for kind, a, b in r["spans"] if kind == "valid"),
                   key=lambda t: -t[0])[:n]  # the kinds beside are counted for these n only
    out = []
    for took, a, b, r in valid:
        beside = collections.Counter(k for k, x, y in r["spans"] if x < b and y > a)
        beside["valid"] -= 1  # itself
        out.append({"ms": round(1000 * took), "at_s": round(a, 1), "beside": dict((+beside).most_common())})
    return out


def summary(records: list[dict]) -> dict:
    """One phase's records (one per round) pooled: answers by code and kind, valid latency quantiles."""
    by_kind, latencies, wrong = collections.defaultdict(collections.Counter), collections.defaultdict(list), []
    for r in records:
        for kind, counts in r["by_kind"].items():
            by_kind[kind].update(counts)
        for kind, values in r["latencies"].items():
            latencies[kind].extend(values)
        wrong += r["wrong"]
    codes = sum(by_kind.values(), collections.Counter())
    all_lat = sorted(x for v in latencies.values() for x in v)
    valid = sorted(latencies["valid"])
    q, qv = (statistics.quantiles(v, n=100, method="inclusive") for v in (all_lat, valid))
    return {"requests": sum(codes.values()), "seconds": round(sum(r["seconds"] for r in records), 1),
            "codes": {str(k): v for k, v in sorted(codes.items(), key=str)},
            "codes_by_kind": {k: {str(s): n for s, n in sorted(v.items(), key=str)} for k, v in sorted(by_kind.items())},
            "wrong": wrong[:20], "n_wrong": len(wrong),
            "valid_failed": sum(n for s, n in by_kind["valid"].items() if s != 200),
            "fivexx": sum(n for s, n in codes.items() if isinstance(s, int) and s >= 500),
            "p50_ms": 1000 * statistics.median(all_lat), "p99_ms": 1000 * q[98],
            "valid_p50_ms": 1000 * statistics.median(valid), "valid_p99_ms": 1000 * qv[98],
            "slowest_valid": slowest_valid(records)}


def report(title: str, phases: dict[str, dict], rss: dict, rounds: list[dict], health: dict, heap: dict,
           leak: dict) -> list[str]:
    plain = phases["plain"]
    lines = [title, "",
             "| phase | requests | answers by code | wrong answer | valid not 200 | p50 / p99 ms (valid) "
             "| valid p50 / p99 vs plain |", "|---|---:|---|---:|---:|---|---|"]
    for name, r in phases.items():
        lines.append(f"| {name} | {r['requests']} | {', '.join(f'{k}: {v}' for k, v in r['codes'].items())} | "
                     f"{r['n_wrong']} | {r['valid_failed']} | {r['valid_p50_ms']:.0f} / {r['valid_p99_ms']:.0f} | "
                     f"{r['valid_p50_ms'] / plain['valid_p50_ms']:.2f} / "
                     f"{r['valid_p99_ms'] / plain['valid_p99_ms']:.2f} |")
    if "poison" in phases:
        lines += ["", "| poison phase: kind | answers |", "|---|---|"]
        lines += [f"| {k} | {', '.join(f'{s}: {n}' for s, n in v.items())} |"
                  for k, v in phases["poison"]["codes_by_kind"].items()]
    lines += ["", "| server RSS, MB | " + " | ".join(["start", "after warm-up", *[f"after {r['name']}" for r in rounds]])
              + " |", "|---|" + "---:|" * (2 + len(rounds)),
              "| | " + " | ".join(f"{v:.0f}" for v in [rss["start_mb"], rss["after_warmup_mb"],
                                                       *[r["rss_mb"] for r in rounds]]) + " |",
              "| server's C heap in use / freed but kept, MB | " + " | ".join(
                  "-" if h is None or h["in_use"] is None else f"{h['in_use']:.0f} / {h['free']:.0f}"
                  for h in heap.values()) + " |", "",
              f"Memory: {rss['start_mb']:.0f} MB at start (server up, no request yet), {rss['after_warmup_mb']:.0f} MB "
              f"after the warm-up, {rss['end_mb']:.0f} MB at the end ({rss['growth_pct']:+.1f}% after the warm-up), "
              f"peak {rss['peak_mb']:.0f} MB; leak check ({leak['measure']}): {leak['after_warmup_mb']:.0f} -> "
              f"{leak['end_mb']:.0f} MB, {leak['growth_pct']:+.1f}% (criterion: at most +{leak['criterion_pct']:g}%); "
              f"5xx answers: {sum(p['fivexx'] for p in phases.values())}; "
              f"requests dropped unrun (client gone or deadline passed): {health.get('requests_dropped')}, "
              f"clients gone: {health.get('clients_gone')}, base rows run / skipped (passes stopped between "
              f"micro-batches): {health.get('base_rows_run')} / {health.get('base_rows_skipped')}, generations "
              f"stopped: {health.get('generations_stopped')}."]
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="minilm-l6")
    ap.add_argument("--heads", nargs="*", help="run folders (default: untrained cola- and conll-shaped heads)")
    ap.add_argument("--clients", type=int, default=50)
    ap.add_argument("--seconds", type=float, default=60.0, help="time budget of each phase")
    ap.add_argument("--max-requests", type=int, default=20000, help="request budget of each phase")
    ap.add_argument("--poison", action="store_true", help="add the poison phase after each plain phase")
    ap.add_argument("--generate", action="store_true",
                    help="poison: also abandoned POST /generate requests (--base must be a decoder LLM, e.g. gemma3-270m)")
    ap.add_argument("--rounds", type=int, default=1, help="rounds of plain (+ poison) phases")
    ap.add_argument("--storm-clients", type=int, default=0,
                    help="add a storm phase: the plain mix's valid requests beside this many clients that send "
                         "heavy bodies and hang up")
    ap.add_argument("--warmup-seconds", type=float, default=10.0)
    ap.add_argument("--poison-body-mb", type=float, default=64, help="most MB one chunked poison body offers")
    ap.add_argument("--read-timeout", type=float, default=10.0, help="serve --read-timeout")
    ap.add_argument("--rss-every", type=float, default=1.0, help="seconds between samples of the server's memory")
    ap.add_argument("--max-heap-growth-pct", type=float, default=10.0,
                    help="pass criterion: the server's heap in use at the end at most this many percent above its value after the warm-up")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--runtime", default="torch", help="serve --runtime (e.g. llama.cpp with a GGUF --base)")
    ap.add_argument("--engine", default="uvicorn", choices=["uvicorn", "ray"], help="serve --engine")
    ap.add_argument("--replicas", type=int, default=1, help="serve --replicas (--engine ray)")
    ap.add_argument("--data", default=str(data_folder(None)), help="the data folder (default: $ADALAYERS_DATA, else ../shared/data)")
    ap.add_argument("--out", default="benchmarks/results/soak")
    args = ap.parse_args()
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    settings["data"] = data_setting(args.data, ROOT)  # the data folder as $ADALAYERS_DATA, never a machine's path
    settings.update(max_texts=MAX_TEXTS, max_chars=MAX_CHARS)
    print("settings:", json.dumps(settings), flush=True)
    texts = sentences(Path(args.data))
    flags = ["--max-batch", "32", "--max-wait-ms", "5", "--max-texts", str(MAX_TEXTS), "--max-chars", str(MAX_CHARS),
             "--read-timeout", str(args.read_timeout), "--engine", args.engine, "--runtime", args.runtime]
    flags += ["--replicas", str(args.replicas)] if args.engine == "ray" else []
    with tempfile.TemporaryDirectory() as tmp, open(Path(tmp) / "server.log", "w") as log:
        heads = args.heads or untrained_heads(args.base, Path(tmp))
        server, url = start_server(args.base, heads, args.threads, flags, log, timeout=600)  # a busy machine
        sampler = RssSampler(server.pid, args.rss_every)
        try:
            tasks = httpx.get(f"{url}/tasks").json()["tasks"]
            mixes = {"plain": requests_mix(texts, tasks[0]["name"])}  # its all-task requests ask the token head
            if args.poison:
                sequence = next(t["name"] for t in tasks if t["kind"] != "token")
                mixes["poison"] = interleave(mixes["plain"], poison_mix(texts, sequence, args.generate))
            if args.storm_clients:
                mixes["storm"] = [m for m in mixes["plain"] if m[0] == "valid"]
            long = (" ".join(texts) * 3)[:MAX_CHARS]
            storm_body = json.dumps({"texts": [long] * MAX_TEXTS}).encode()
            rss, heap = {"start_mb": sampler.sample()}, {"start": heap_mb(url)}
            sampler.start()
            sampler.phase = "warm-up"
            asyncio.run(soak(url, args.clients, args.warmup_seconds, 500, mixes[list(mixes)[-1]], args.poison_body_mb))
            rss["after_warmup_mb"], heap["after warm-up"] = sampler.sample(), heap_mb(url)
            records, rounds = collections.defaultdict(list), []
            for k in range(args.rounds):
                for name, mix in mixes.items():
                    sampler.phase = f"{name} {k + 1}"
                    records[name].append(asyncio.run(soak(url, args.clients, args.seconds, args.max_requests, mix,
                                                          args.poison_body_mb, args.storm_clients if name == "storm"
                                                          else 0, storm_body)))
                    rounds.append({"name": sampler.phase, "rss_mb": round(sampler.sample(), 1)})
                    heap[f"after {sampler.phase}"] = heap_mb(url)
            sampler.phase = "end"
            health = httpx.get(f"{url}/health").json()
        finally:
            sampler.stop()
            server.terminate()
            server.wait(timeout=180)  # Ray Serve drains its replicas and stops Ray first
    phases = {name: summary(r) for name, r in records.items()}
    rss = {k: round(v, 1) for k, v in rss.items()}
    rss.update(end_mb=rounds[-1]["rss_mb"], peak_mb=max(mb for _, _, mb in sampler.samples))
    rss["growth_pct"] = round(100 * (rss["end_mb"] - rss["after_warmup_mb"]) / rss["after_warmup_mb"], 2)
    rss["start_to_end_pct"] = round(100 * (rss["end_mb"] - rss["start_mb"]) / rss["start_mb"], 2)
    per = len(mixes)  # growth over each whole round after the first: a leak keeps growing, warm-up does not
    rss["round_growth_pct"] = [round(100 * (rounds[i + per - 1]["rss_mb"] - rounds[i - 1]["rss_mb"])
                                     / rounds[i - 1]["rss_mb"], 2) for i in range(per, len(rounds), per)]
    first, last = heap["after warm-up"], heap[f"after {rounds[-1]['name']}"]
    if first and first["in_use"] is not None and last and last["in_use"] is not None:
        leak = {"measure": "heap in use", "after_warmup_mb": first["in_use"], "end_mb": last["in_use"]}
    else:
        leak = {"measure": "RSS", "after_warmup_mb": rss["after_warmup_mb"], "end_mb": rss["end_mb"]}
    leak.update(growth_pct=round(100 * (leak["end_mb"] - leak["after_warmup_mb"]) / leak["after_warmup_mb"], 2),
                criterion_pct=args.max_heap_growth_pct)
    fivexx = sum(p["fivexx"] for p in phases.values())
    passed = (fivexx == 0 and all(p["n_wrong"] == 0 and p["valid_failed"] == 0 for p in phases.values())
              and leak["growth_pct"] <= args.max_heap_growth_pct)  # a heap that shrinks leaks nothing
    result = {"phases": phases, "rss": rss, "server_heap_mb": heap, "leak_check": leak, "rounds": rounds, "fivexx": fivexx, "server_health_at_end": health,
              "passed": passed, "rss_samples": sampler.samples}
    for name in ("poison", "storm"):
        if name in phases:
            result[f"{name}_vs_plain"] = {q: round(phases[name][f"valid_{q}_ms"] / phases["plain"][f"valid_{q}_ms"], 3)
                                          for q in ("p50", "p99")}
    engine = "uvicorn" if args.engine == "uvicorn" else f"Ray Serve, {args.replicas} replica(s)"
    lines = report(f"### Soak ({engine}): {args.clients} clients, {args.rounds} x {args.seconds:g} s per phase, "
                   f"{args.base} on {args.runtime}, heads {', '.join(Path(h).name for h in heads)}, CPU {args.threads} thread(s)",
                   phases, rss, rounds, health, heap, leak)
    write_json(Path(args.out + ".json"), {"settings": settings, "result": result})
    atomic_write(Path(args.out + ".md"), "\n".join(lines) + "\n")
    print("\n".join(lines))
    print("PASSED" if passed else f"FAILED: {[w for p in phases.values() for w in p['wrong']][:5]}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
