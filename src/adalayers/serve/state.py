"""What every router of the service shares: the heads, the settings, the batcher and the decoder.

create_app (serve/app.py) builds one ServeState and hands it to each router's add_routes. Routes that
answer texts (/predict, /v1/classify, /v1/embeddings) go through ServeState.answer_texts: limits,
text rules and task names checked, then queued in the batcher (serve/batcher.py) and awaited. Routes
that generate (/generate, /v1/completions, /v1/chat/completions) share ServeState.decode.
"""
from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from fastapi import HTTPException, Request

from adalayers.errors import AdaLayersError, DataError
from adalayers.infer.generate import stream
from adalayers.infer.sidetasks import SideTasks
from adalayers.serve.batcher import Batcher, Busy
from adalayers.serve.config import ServeConfig
from adalayers.serve.limits import client_gone
from adalayers.serve.metrics import Metrics
from adalayers.serve.scheduler import Scheduler
from adalayers.textcheck import text_problem


def public_name(base: str) -> str:
    """A base loaded from a local folder is named by the folder's name only: clients never see server paths."""
    path = Path(base)
    return path.name if path.is_absolute() or base.startswith(".") or path.exists() else base


def scheduler(side, cfg) -> Scheduler | None:
    """The continuous-batching scheduler (serve/scheduler.py) the service generates through, or None: with
    cfg.continuous_batching off (or a runtime that cannot merge caches), infer/generate.stream per request
    (each alone, taking turns between steps)."""
    rows = cfg.parallel or cfg.max_batch  # rows decoding together at most
    return Scheduler(side, rows) if cfg.continuous_batching and Scheduler.supports(side.backbone) else None


@dataclass
class ServeState:
    """The service's shared parts. `batcher`: Batcher, or Ray Serve's ServeBatcher (the same interface:
    submit -> Job, run, queue, counters); `decode(prompts, **stream's options)` gives stream's events."""
    side: SideTasks
    cfg: ServeConfig
    batcher: Batcher
    decode: Callable
    name: str = ""           # the base's public name (never a server path)
    started: float = field(default_factory=time.time)
    scheduler: Scheduler | None = None  # the one behind decode, when generations share decode steps
    metrics: Metrics = field(default_factory=Metrics)  # GET /metrics (serve/metrics.py); decode reports to it

    @classmethod
    def build(cls, side: SideTasks, cfg: ServeConfig, batcher=None) -> ServeState:
        batcher = batcher or Batcher(side, max(1, cfg.max_batch), max(0.0, cfg.max_wait_ms) / 1000,
                                     max(1, cfg.max_batch_tokens), max(1, cfg.max_queue), cfg.slice_ms / 1000)
        sched = scheduler(side, cfg)
        decode = sched.stream if sched is not None else functools.partial(stream, side)
        metrics = Metrics()
        return cls(side, cfg, batcher, metrics.watching(decode), public_name(side.backbone.name), scheduler=sched,
                   metrics=metrics)

    def busy(self) -> HTTPException:
        """The 503 of a full queue, with the Retry-After the batcher expects."""
        return HTTPException(503, f"the queue is full ({self.batcher.max_queue} requests pending, --max-queue); "
                                  "retry later", headers={"Retry-After": str(self.batcher.retry_after_s())})

    def expired(self) -> HTTPException:
        """The 503 of a request past its deadline (--request-timeout)."""
        return HTTPException(503, f"not answered within {self.cfg.request_timeout_s:g} s (--request-timeout); "
                                  "retry later", headers={"Retry-After": str(self.batcher.retry_after_s())})

    async def answer_texts(self, request: Request, arrived: float, texts: list[str], text_pairs: list[str] | None,
                           tasks: list[str] | None) -> tuple[list[dict], int]:
        """Check texts (limits, text rules, task names), queue them in the batcher and await their results:
        (results as /predict gives them, tokens run). Every failure is an HTTPException naming the problem
        (a client gone: 499, never sent). /predict and the /v1 classify and embeddings routes answer through this."""
        tasks, per_text = await self._checked(texts, text_pairs, tasks)
        tokens = sum(per_text)
        if await request.is_disconnected():  # hung up while it was being checked: never queued, never run
            self.batcher.gone += 1
            self.batcher.dropped += 1
            raise HTTPException(499, "client disconnected")  # never sent
        try:
            job = self.batcher.submit(texts, tasks, tokens, text_pairs, per_text)
        except Busy:
            raise self.busy() from None
        gone = asyncio.create_task(client_gone(request))
        try:
            left = self.cfg.request_timeout_s - (time.perf_counter() - arrived)
            await asyncio.wait({job.future, gone}, timeout=max(0.0, left), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not job.future.done():
            job.future.cancel()  # the batcher drops it unrun
            if gone.done() and not gone.cancelled():
                self.batcher.gone += 1
                raise HTTPException(499, "client disconnected")  # never sent
            self.batcher.expired += 1
            raise self.expired()
        try:
            return job.future.result(), tokens
        except DataError as e:
            raise HTTPException(422, str(e)) from None
        except AdaLayersError as e:
            raise HTTPException(500, f"server-side error: {e}") from None
        except Exception as e:  # noqa: BLE001  (logged by the batcher)
            raise HTTPException(500, f"server-side error ({type(e).__name__}); see the server log") from None

    async def embed_texts(self, texts: list[str], arrived: float) -> tuple[list[list[float]], int]:
        """A decoder base's embeddings (SideTasks.embed, --pooling) and the tokens run: the texts checked as
        answer_texts checks them, counted under --max-queue, answered within --request-timeout (else 503)."""
        _, per_text = await self._checked(texts, None, [])
        release = self.batcher.admit() if hasattr(self.batcher, "admit") else (lambda: None)
        if release is None:
            raise self.busy()
        work = asyncio.ensure_future(asyncio.to_thread(self.side.embed, texts, self.cfg.pooling))
        work.add_done_callback(lambda f: (release(), f.cancelled() or f.exception()))  # pending until it ends
        done, _ = await asyncio.wait({work}, timeout=max(0.0, self.cfg.request_timeout_s - (time.perf_counter()
                                                                                          - arrived)))
        if not done:
            self.batcher.expired += 1
            raise self.expired()
        try:
            return work.result(), sum(per_text)
        except DataError as e:
            raise HTTPException(422, str(e)) from None

    async def _checked(self, texts: list[str], text_pairs: list[str] | None,
                       tasks: list[str] | None) -> tuple[list[str], list[int]]:
        """(the heads to run, the tokens each text needs), or the HTTPException naming its first problem."""
        for what, given in (("text", texts), ("second text", text_pairs or [])):
            for i, t in enumerate(given):
                if len(t) > self.cfg.max_chars:
                    raise HTTPException(413, f"{what} {i + 1} has {len(t)} characters; the limit is "
                                             f"{self.cfg.max_chars} (--max-chars)")
                problem = text_problem(t)
                if problem:
                    raise HTTPException(422, f"{what} {i + 1} {problem}")
        side = self.side
        unknown = [t for t in (tasks or []) if t not in side.heads]
        if unknown:
            raise HTTPException(400, f"unknown task(s): {', '.join(unknown)}; known tasks: {', '.join(side.names)}")
        try:  # the named heads (or, by default, those that take this input): pairs for pair heads only
            tasks = side.select(list(dict.fromkeys(tasks)) if tasks is not None else None, text_pairs is not None)
            per_text = list(await asyncio.to_thread(side.count_tokens, texts, tasks, text_pairs))
        except DataError as e:
            raise HTTPException(422, str(e)) from None
        tokens = sum(per_text)
        if tokens > self.cfg.max_tokens:
            raise HTTPException(413, f"the request needs {tokens} tokens (with token-head windows); the limit is "
                                     f"{self.cfg.max_tokens} (--max-tokens)")
        return tasks, per_text
