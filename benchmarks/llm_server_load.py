"""The load side of benchmarks/llm_server.py: concurrent streaming clients (the `openai` client) against one
OpenAI-style server, and the peak RSS of the server's process tree while they run.

Each client streams one completion of `new` tokens (temperature 0 unless sampling says otherwise) and records, from its own clock: the time
to its first chunk with text (TTFT), the gaps between its chunks with text (inter-token latency), the tokens
generated (the server's `usage` when it sends one, else its chunks with text) and the finish reason.
"""
from __future__ import annotations

import asyncio
import statistics
import threading
import time
from dataclasses import dataclass, field

import psutil


@dataclass
class ClientResult:
    ttft: float
    gaps: list[float]
    tokens: int
    prompt_tokens: int | None
    finish: str | None
    error: str | None = None


def quantile(values: list[float], q: float) -> float | None:
    """The q-quantile (nearest rank on the sorted values), or None when there are none."""
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


async def one_client(url: str, model: str, prompt: str, new: int, extra: dict, timeout: float,
                     sampling: dict) -> ClientResult:
    import openai

    async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=timeout) as client:
        t0 = time.perf_counter()
        first, last, gaps, chunks, usage, finish = None, None, [], 0, None, None
        try:
            stream = await client.completions.create(model=model, prompt=prompt, max_tokens=new, **sampling,
                                                     stream=True, stream_options={"include_usage": True},
                                                     extra_body=extra)
            async for chunk in stream:
                now = time.perf_counter()
                if chunk.choices and chunk.choices[0].text:
                    chunks += 1
                    if first is None:
                        first = now - t0
                    else:
                        gaps.append(now - last)
                    last = now
                if chunk.choices and chunk.choices[0].finish_reason:
                    finish = chunk.choices[0].finish_reason
                if getattr(chunk, "usage", None) is not None:
                    usage = chunk.usage
        except Exception as e:  # noqa: BLE001  (a failed client is recorded, not fatal to the cell)
            return ClientResult(float("nan"), gaps, chunks, None, finish, f"{type(e).__name__}: {e}"[:300])
        tokens = usage.completion_tokens if usage is not None and usage.completion_tokens else chunks
        return ClientResult(first if first is not None else float("nan"), gaps, tokens,
                            usage.prompt_tokens if usage is not None else None, finish)


async def _cell(url, model, prompts, new, extra, timeout, sampling):
    t0 = time.perf_counter()
    results = await asyncio.gather(*(one_client(url, model, p, new, extra, timeout, sampling) for p in prompts))
    return results, time.perf_counter() - t0


def run_cell(url: str, model: str, prompts: list[str], new: int, extra: dict, timeout: float,
             sampling: dict | None = None) -> dict:
    """len(prompts) clients at once, one completion each (`sampling`: the request's temperature, top_p, ...;
    default greedy, temperature 0): the cell's summary (tokens/s over the wall time from the first request to the
    last stream's end, TTFT and inter-token percentiles over all clients)."""
    results, wall = asyncio.run(_cell(url, model, prompts, new, extra, timeout, sampling or {"temperature": 0}))
    ok = [r for r in results if r.error is None]
    ttfts = [r.ttft for r in ok if r.ttft == r.ttft]
    gaps = [g for r in ok for g in r.gaps]
    tokens = sum(r.tokens for r in ok)
    return {"clients": len(prompts), "wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall,
            "ttft_p50": quantile(ttfts, 0.5), "ttft_p99": quantile(ttfts, 0.99),
            "itl_p50": quantile(gaps, 0.5), "itl_p99": quantile(gaps, 0.99),
            "tokens_per_client": [r.tokens for r in results],
            "prompt_tokens": [r.prompt_tokens for r in results],
            "finish_reasons": sorted({str(r.finish) for r in ok}),
            "errors": [r.error for r in results if r.error is not None]}


@dataclass
class RssPeak:
    """Samples the summed RSS of a process and all its descendants every `period` seconds, in a thread."""
    pid: int
    period: float = 0.1
    peak_mb: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def sample(self) -> float:
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return 0.0
        total = 0
        for p in procs:
            try:
                total += p.memory_info().rss
            except psutil.Error:
                pass
        mb = total / 2**20
        self.peak_mb = max(self.peak_mb, mb)
        return mb

    def start(self) -> "RssPeak":
        def loop():
            while not self._stop.wait(self.period):
                self.sample()
        self._thread = threading.Thread(target=loop, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> float:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        return self.peak_mb


def median_cell(cells: list[dict]) -> dict:
    """Per measure, the median over repeats (of the cells that ran)."""
    out = {"repeats": len(cells)}
    for key in ("tokens_per_s", "ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "wall_s", "tokens"):
        vals = [c[key] for c in cells if c.get(key) is not None]
        out[key] = statistics.median(vals) if vals else None
    out["errors"] = sum(len(c["errors"]) for c in cells)
    out["tokens_per_client_min"] = min(min(c["tokens_per_client"]) for c in cells)
    out["tokens_per_client_max"] = max(max(c["tokens_per_client"]) for c in cells)
    return out
