"""What every router of the service shares: the heads, the settings, the batcher, the decoder and the
generation service.

create_app (serve/app.py) builds one ServeState and hands it to each router's add_routes. Routes that
answer texts (/predict, /v1/classify, /v1/embeddings) go through ServeState.answer_texts: limits,
text rules and task names checked (serve/validate.py), then queued in the batcher (serve/batcher.py) and
awaited. Routes that generate (/generate, /generate/stream, /v1/completions, /v1/chat/completions) go through
ServeState.generation (serve/generation.py), over ServeState.decode. Failures are the typed errors of
serve/errors.py, answered by each router in its shape.
"""
from __future__ import annotations

import asyncio
import functools
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from fastapi import Request

from adalayers.errors import AdaLayersError, DataError
from adalayers.infer.generate import start
from adalayers.infer.predictor_base import PredictorBase
from adalayers.serve.batcher import MicroBatcher
from adalayers.serve.batching import Batcher, Busy
from adalayers.serve.config import ServeConfig
from adalayers.serve.errors import BadRequest, BadText, ClientGone, ServerError, TooLarge
from adalayers.serve.generation import GenerationService
from adalayers.serve.guards import GuardPolicy
from adalayers.serve.lanes import CheckLane
from adalayers.serve.limits import client_gone
from adalayers.serve.metrics import Metrics
from adalayers.serve.scheduler import Scheduler
from adalayers.serve.validate import check_tasks, check_texts


CLIENT_HEADER, MAX_CLIENT_ID = "x-client-id", 128


def client_of(request: Request) -> str:
    """Who sent a request, for the batcher's fair share (serve/batcher.py): its X-Client-Id header when it has one
    (at most MAX_CLIENT_ID characters; a tenant as the gateway in front names it: a client that names itself
    gets no more than one share per name), else its address. Loopback clients all share one address."""
    named = request.headers.get(CLIENT_HEADER)
    if named is not None:
        if not named.strip() or len(named) > MAX_CLIENT_ID:
            raise BadRequest(f"X-Client-Id: must be 1 to {MAX_CLIENT_ID} characters, got {len(named.strip())}")
        return "id:" + named.strip()
    return "addr:" + (request.client.host if request.client else "")


def public_name(base: str) -> str:
    """A base loaded from a local folder is named by the folder's name only: clients never see server paths."""
    path = Path(base)
    return path.name if path.is_absolute() or base.startswith(".") or path.exists() else base


def scheduler(side, cfg) -> Scheduler | None:
    """The continuous-batching scheduler (serve/scheduler.py) the service generates through, or None: with
    cfg.continuous_batching off (or a runtime that cannot merge caches), infer/generate.stream per request
    (each alone, taking turns between steps)."""
    rows = cfg.parallel or cfg.max_batch  # rows decoding together at most
    return Scheduler(side, rows, cfg.batch_size) if cfg.continuous_batching and Scheduler.supports(side) else None


@dataclass
class ServeState:
    """The service's shared parts. `batcher`: a serve/batching.Batcher (MicroBatcher, or Ray Serve's
    ServeBatcher); `decode(prompts, params, route=..., request_id=...)` gives infer/generate.start's events;
    `generation` the one path of every generating route."""
    side: PredictorBase
    cfg: ServeConfig
    batcher: Batcher
    decode: Callable
    generation: GenerationService
    name: str = ""           # the base's public name (never a server path)
    started: float = field(default_factory=time.time)
    scheduler: Scheduler | None = None  # the one behind decode, when generations share decode steps
    guards: GuardPolicy | None = None  # the server's guards (--guard), joined to every request's
    metrics: Metrics = field(default_factory=Metrics)  # GET /metrics (serve/metrics.py); decode reports to it
    checks: CheckLane | None = None  # where requests' token counts wait for their turn (serve/lanes.py)

    def __post_init__(self):
        if self.checks is None:
            self.checks = CheckLane(max(1, self.cfg.max_queue), self.cfg.max_chars)

    @classmethod
    def build(cls, side: PredictorBase, cfg: ServeConfig, batcher: Batcher | None = None) -> ServeState:
        batcher = batcher or MicroBatcher(side, max(1, cfg.max_batch), max(0.0, cfg.max_wait_ms) / 1000,
                                     max(1, cfg.max_batch_tokens), max(1, cfg.max_queue), cfg.slice_ms / 1000)
        sched = scheduler(side, cfg)
        metrics = Metrics()
        guards = GuardPolicy.from_config(cfg, side, metrics)
        decode = metrics.watching(guards.wrap(sched.stream if sched is not None else functools.partial(start, side)))
        return cls(side, cfg, batcher, decode, GenerationService(decode, batcher, cfg.request_timeout_s),
                   public_name(side.backbone.name), scheduler=sched, metrics=metrics, guards=guards)

    async def answer_texts(self, request: Request, arrived: float, texts: list[str], text_pairs: list[str] | None,
                           tasks: list[str] | None) -> tuple[list[dict], int]:
        """Check texts (limits, text rules, task names), queue them in the batcher and await their results:
        (results as /predict gives them, tokens run). Every failure is a typed error naming the problem
        (serve/errors.py; a client gone: 499, never sent). /predict and the /v1 classify and embeddings routes
        answer through this."""
        client = client_of(request)
        if await request.is_disconnected():  # hung up while its body was parsed: not even checked
            raise self._gone()
        gone = asyncio.create_task(client_gone(request))  # one watcher for the request's whole life
        left = threading.Event()  # ... that the checks' thread reads: a count whose client left is never run
        gone.add_done_callback(lambda _: left.set())
        try:
            try:
                tasks, per_text = await self._checked(texts, text_pairs, tasks, left)
            except ClientGone:
                raise self._gone() from None
            if gone.done():  # hung up while it was checked: never queued, never run
                raise self._gone()
            tokens = sum(per_text)
            try:
                job = self.batcher.submit(texts, tasks, tokens, text_pairs, per_text, client)
            except Busy:
                raise self.generation.busy() from None
            wait = self.cfg.request_timeout_s - (time.perf_counter() - arrived)
            await asyncio.wait({job.future, gone}, timeout=max(0.0, wait), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not job.future.done():
            job.future.cancel()  # the batcher drops it unrun
            if gone.done() and not gone.cancelled():
                self.batcher.gone += 1
                raise ClientGone("client disconnected")  # never sent
            self.batcher.expired += 1
            raise self.generation.expired()
        try:
            return job.future.result(), tokens
        except DataError as e:
            raise BadText(str(e)) from None
        except AdaLayersError as e:
            raise ServerError(f"server-side error: {e}") from None
        except Exception as e:  # noqa: BLE001  (logged by the batcher)
            raise ServerError(f"server-side error ({type(e).__name__}); see the server log") from None

    async def embed_texts(self, texts: list[str], arrived: float) -> tuple[list[list[float]], int]:
        """A decoder base's embeddings (PredictorBase.embed, --pooling) and the tokens run: the texts checked as
        answer_texts checks them, counted under --max-queue, answered within --request-timeout (else 503)."""
        _, per_text = await self._checked(texts, None, [])
        release = self.batcher.admit()
        if release is None:
            raise self.generation.busy()
        work = asyncio.ensure_future(asyncio.to_thread(self.side.embed, texts, self.cfg.pooling))
        work.add_done_callback(lambda f: (release(), f.cancelled() or f.exception()))  # pending until it ends
        done, _ = await asyncio.wait({work}, timeout=max(0.0, self.cfg.request_timeout_s - (time.perf_counter()
                                                                                          - arrived)))
        if not done:
            self.batcher.expired += 1
            raise self.generation.expired()
        try:
            return work.result(), sum(per_text)
        except DataError as e:
            raise BadText(str(e)) from None

    def _gone(self) -> ClientGone:
        """A request whose client left before it was queued: counted as dropped unrun, never answered."""
        self.batcher.gone += 1
        self.batcher.dropped += 1
        return ClientGone("client disconnected")  # never sent

    async def _checked(self, texts: list[str], text_pairs: list[str] | None, tasks: list[str] | None,
                       gone: threading.Event | None = None) -> tuple[list[str], list[int]]:
        """(the heads to run, the tokens each text needs), or the typed error naming its first problem. The
        tokens are counted in the checks' lane (ClientGone, uncounted, once `gone` is set before its turn; a
        full lane: 503)."""
        check_texts(texts, self.cfg.max_chars, "text")
        check_texts(text_pairs or [], self.cfg.max_chars, "second text")
        side = self.side
        check_tasks(side, tasks)
        try:  # the named heads (or, by default, those that take this input): pairs for pair heads only
            tasks = side.select(list(dict.fromkeys(tasks)) if tasks is not None else None, text_pairs is not None)
            size = sum(map(len, texts)) + sum(map(len, text_pairs or []))
            per_text = list(await self.checks.run(side.count_tokens, texts, tasks, text_pairs, size=size, gone=gone))
        except DataError as e:
            raise BadText(str(e)) from None
        except Busy:  # the checks' lane is full
            self.batcher.refused += 1
            raise self.generation.busy() from None
        tokens = sum(per_text)
        if tokens > self.cfg.max_tokens:
            raise TooLarge(f"the request needs {tokens} tokens (with token-head windows); the limit is "
                           f"{self.cfg.max_tokens} (--max-tokens)")
        return tasks, per_text
