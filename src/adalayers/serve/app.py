"""The HTTP service: FastAPI app around one SideTasks, with micro-batching of concurrent requests.

    POST /predict  {"texts": [...], "tasks": [...optional subset...]}  -> {"results": [one object per text]}
                   sentence pairs: {"texts": [["a", "b"], ...]} or {"texts": ["a", ...], "text_pairs": ["b", ...]}
    GET  /tasks    the heads: names, kinds, labels, layer weights (never the server's run folder paths)
    GET  /health   liveness, counters and memory (serve/memory.py; open even when an API key is set)
    GET  /openapi.json, /docs, /redoc (their scripts served from the package: no CDN)
    GET  /         the playground page (serve/routers/ui.py; ServeConfig.ui, --no-ui leaves it out)
    /v1/models, /v1/chat/completions, /v1/completions, /v1/classify, /v1/embeddings: OpenAI- and
                   vLLM-compatible (serve/routers/openai.py)

Requests wait in a bounded asyncio queue (full: 503 with Retry-After); one worker takes the first,
gathers whatever else arrives within max_wait_ms (up to max_batch texts and max_batch_tokens
tokens), and runs them as one base pass in a thread, so the event loop keeps accepting requests
while the model runs. One request never fails another: each is validated alone before it is
queued, and when a batch still fails its requests are rerun one by one, so only the faulty one
gets the error. A request whose client has disconnected (before it is queued, or while it waits),
or whose deadline (request_timeout_s) has passed, is dropped unrun.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI, HTTPException, Request
from fastapi_offline import FastAPIOffline
from pydantic import BaseModel, Field

from adalayers.serve.config import ServeConfig
from adalayers.errors import AdaLayersError, Cancelled, DataError
from adalayers.kinds import TaskKind
from adalayers.infer.sidetasks import SideTasks
from adalayers.serve.auth import BearerAuth
from adalayers.serve.limits import BodyLimit, FiniteRequest, add_error_handlers, client_gone, max_body_bytes
from adalayers.serve.memory import process_memory
from adalayers.serve.routers.ui import add_ui_routes
from adalayers.textcheck import text_problem

log = logging.getLogger(__name__)


class PredictRequest(FiniteRequest):
    texts: list[str | list[str]] = Field(description="Texts to run; each is split into words on whitespace for token "
                                                     "tasks. For heads trained on sentence pairs: [text, second] "
                                                     "lists, or texts plus text_pairs.")
    text_pairs: list[str] | None = Field(None, description="The second text of each text, for heads trained on "
                                                           "sentence pairs (or give [text, second] lists in texts).")
    tasks: list[str] | None = Field(None, description="Names of the side tasks to answer (default: all).")
    base: bool = Field(True, description="Include the base model's own output (e.g. its sentence embedding).")


class PredictResponse(BaseModel):
    results: list[dict] = Field(description="Per text: truncated, base (its own output) and tasks {name: prediction}.")


class Busy(Exception):
    """The queue is full."""


@dataclass
class _Job:
    texts: list[str]
    tasks: list[str]
    tokens: int
    future: asyncio.Future
    text_pairs: list[str] | None = None


@dataclass
class Batcher:
    """Gathers concurrent requests into batches of at most max_batch texts and max_batch_tokens tokens
    and runs them in a thread; at most max_queue requests wait."""
    side: SideTasks
    max_batch: int
    max_wait_s: float
    max_batch_tokens: int = 16_384
    max_queue: int = 64
    queue: asyncio.Queue = None
    passes: int = 0      # groups run (each is one predict call: one base pass per max_batch texts)
    requests: int = 0
    dropped: int = 0     # requests dropped unrun: their client left or their deadline passed
    gone: int = 0        # requests whose client disconnected before the answer
    expired: int = 0     # requests answered 503 at their deadline
    busy: bool = False   # a group is running
    largest_tokens: int = 0  # the most tokens one group has held
    refused: int = 0     # requests answered 503 because the queue was full
    pass_s: float = 0.0  # running mean of a group's seconds (for Retry-After)
    pending: int = 0     # requests queued or running whose answer is still awaited
    generations_stopped: int = 0  # /generate runs stopped at a decode step: client gone or deadline passed

    def __post_init__(self):
        self.queue = asyncio.Queue()

    def submit(self, texts: list[str], tasks: list[str], tokens: int, text_pairs: list[str] | None = None) -> _Job:
        """Queue a job (its future holds the results), or raise Busy when max_queue requests are pending.
        A request whose client left or whose deadline passed stops counting at once (its future is
        cancelled), though the worker only discards it when it reaches it."""
        if self.pending >= self.max_queue:
            self.refused += 1
            raise Busy()
        job = _Job(texts, tasks, tokens, asyncio.get_running_loop().create_future(), text_pairs)
        self.pending += 1
        job.future.add_done_callback(self._settled)
        self.queue.put_nowait(job)
        return job

    def _settled(self, _future) -> None:
        self.pending -= 1

    def admit(self):
        """Count work that does not go through the queue (a generation) as pending, under the same
        --max-queue: returns the function that ends its count, or None when max_queue requests are pending."""
        if self.pending >= self.max_queue:
            self.refused += 1
            return None
        self.pending += 1
        ended = []

        def release() -> None:
            if not ended:
                ended.append(True)
                self.pending -= 1
        return release

    def retry_after_s(self) -> int:
        return max(1, math.ceil(self.pass_s * (self.pending + 1)))

    async def _next(self) -> _Job:
        while True:  # skip jobs nobody waits for any more
            job = await self.queue.get()
            if not job.future.done():
                return job
            self.dropped += 1

    async def run(self) -> None:
        loop, carry = asyncio.get_running_loop(), None
        while True:
            group = [carry or await self._next()]
            carry, n, tokens = None, len(group[0].texts), group[0].tokens
            deadline = loop.time() + self.max_wait_s
            while n < self.max_batch and tokens < self.max_batch_tokens:
                try:
                    left = deadline - loop.time()
                    job = self.queue.get_nowait() if left <= 0 else await asyncio.wait_for(self.queue.get(), left)
                except (asyncio.QueueEmpty, asyncio.TimeoutError):
                    break
                if job.future.done():
                    self.dropped += 1
                    continue
                if n + len(job.texts) > self.max_batch or tokens + job.tokens > self.max_batch_tokens:
                    carry = job  # starts the next group
                    break
                group.append(job)
                n, tokens = n + len(job.texts), tokens + job.tokens
            await self._run_group(group)

    async def _predict(self, jobs: list[_Job]) -> list[list[dict]]:
        """One predict_group call for `jobs` (one answer per job)."""
        self.largest_tokens = max(self.largest_tokens, sum(job.tokens for job in jobs))
        t0, self.busy = time.perf_counter(), True
        try:
            answers = await asyncio.to_thread(predict_group, self.side,
                                              [(job.texts, job.tasks, job.text_pairs) for job in jobs],
                                              lambda: [job.future.done() for job in jobs])
        finally:
            self.busy = False
        self.passes += 1
        self.pass_s = 0.8 * self.pass_s + 0.2 * (time.perf_counter() - t0) if self.pass_s else time.perf_counter() - t0
        return answers

    async def _run_group(self, group: list[_Job]) -> None:
        """Single texts and sentence pairs of one group go to the base as two predict calls."""
        for pairs in (False, True):
            part = [job for job in group if (job.text_pairs is not None) == pairs]
            if part:
                await self._run_part(part)

    async def _run_part(self, group: list[_Job]) -> None:
        live = [job for job in group if not job.future.done()]
        self.dropped += len(group) - len(live)
        if not live:
            return
        try:
            self._deliver(live, await self._predict(live))
        except Cancelled:  # every client left or every deadline passed during the pass: stopped between batches
            self.dropped += len(live)
        except Exception as e:  # noqa: BLE001
            if len(live) == 1:
                return self._fail(live[0], e)
            log.warning("a batch of %d requests failed (%s); running them one at a time", len(live), e)
            for job in live:  # only the request that fails alone gets the error
                if job.future.done():
                    self.dropped += 1
                    continue
                try:
                    self._deliver([job], await self._predict([job]))
                except Cancelled:
                    self.dropped += 1
                except Exception as e1:  # noqa: BLE001
                    self._fail(job, e1)

    def _deliver(self, jobs: list[_Job], answers: list[list[dict]]) -> None:
        for job, mine in zip(jobs, answers):
            if not job.future.done():
                job.future.set_result(mine)
                self.requests += 1

    @staticmethod
    def _fail(job: _Job, e: Exception) -> None:
        if not isinstance(e, DataError):
            log.error("a request failed on the server side: %s", e, exc_info=e)
        if not job.future.done():
            job.future.set_exception(e)


def public_name(base: str) -> str:
    """A base loaded from a local folder is named by the folder's name only: clients never see server paths."""
    path = Path(base)
    return path.name if path.is_absolute() or base.startswith(".") or path.exists() else base


def predict_group(side: SideTasks, group: list[tuple[list[str], list[str], list[str] | None]],
                  gone=None) -> list[list[dict]]:
    """Requests (texts, tasks, text_pairs) of one kind (all single texts, or all sentence pairs) as one
    SideTasks.predict call, one base pass per batch; each request gets its own results with its own tasks.
    A request's long texts are split into token-head windows only when that request asks for a token
    head (what it was charged for), never for another request's. `gone()`: per request, whether nobody
    waits for it any more; its texts' remaining rows are skipped (SideTasks.predict's `abandoned`) and its
    answer is left empty.
    The uvicorn Batcher and the Ray Serve batch (serve/ray_serve.py) both answer through this."""
    texts = [t for texts, _, _ in group for t in texts]
    second = [t for _, _, pairs in group for t in pairs] if group[0][2] is not None else None
    windows = [any(side.heads[n].kind == TaskKind.TOKENS for n in tasks) for texts, tasks, _ in group
               for _ in texts]
    starts = [0]
    for texts_, _, _ in group:
        starts.append(starts[-1] + len(texts_))

    def abandoned() -> set[int]:
        return {t for k, done in enumerate(gone()) if done for t in range(starts[k], starts[k + 1])}

    results = side.predict(texts, list(dict.fromkeys(name for _, tasks, _ in group for name in tasks)), second,
                           windows=windows, abandoned=abandoned if gone is not None else None)
    answers = []
    for k, (_, tasks, _) in enumerate(group):
        mine = results[starts[k]: starts[k + 1]]
        if any(r is None for r in mine):
            mine = []  # skipped: nobody waits for this request
        for r in mine:
            r["tasks"] = {name: r["tasks"][name] for name in tasks}
        answers.append(mine)
    return answers


def _split_pairs(req: PredictRequest) -> tuple[list[str], list[str] | None]:
    """texts of strings (+ optional text_pairs), or texts of [text, second] lists -> (texts, second texts)."""
    lists = [isinstance(t, list) for t in req.texts]
    if not any(lists):
        if req.text_pairs is not None and len(req.text_pairs) != len(req.texts):
            raise HTTPException(422, f"{len(req.texts)} texts but {len(req.text_pairs)} text_pairs: give one "
                                     f"second text per text")
        return list(req.texts), req.text_pairs
    if not all(lists) or req.text_pairs is not None:
        raise HTTPException(422, "texts mixes single texts and [text, second] pairs (or pairs and text_pairs): "
                                 "give one kind per request")
    bad = [i + 1 for i, t in enumerate(req.texts) if len(t) != 2]
    if bad:
        raise HTTPException(422, f"text {bad[0]} is a list of {len(req.texts[bad[0] - 1])} texts; a sentence pair "
                                 f"is [text, second]")
    return [t[0] for t in req.texts], [t[1] for t in req.texts]


async def answer_texts(side: SideTasks, batcher, cfg: ServeConfig, request: Request, arrived: float,
                       texts: list[str], text_pairs: list[str] | None, tasks: list[str] | None
                       ) -> tuple[list[dict], int]:
    """Check texts (limits, text rules, task names), queue them in the batcher and await their results:
    (results as /predict gives them, tokens run). Every failure is an HTTPException naming the problem
    (a client gone: 499, never sent). /predict and the /v1 classify and embeddings routes answer through this."""
    for what, given in (("text", texts), ("second text", text_pairs or [])):
        for i, t in enumerate(given):
            if len(t) > cfg.max_chars:
                raise HTTPException(413, f"{what} {i + 1} has {len(t)} characters; the limit is "
                                         f"{cfg.max_chars} (--max-chars)")
            problem = text_problem(t)
            if problem:
                raise HTTPException(422, f"{what} {i + 1} {problem}")
    unknown = [t for t in (tasks or []) if t not in side.heads]
    if unknown:
        raise HTTPException(400, f"unknown task(s): {', '.join(unknown)}; known tasks: {', '.join(side.names)}")
    try:  # the named heads (or, by default, those that take this input): pairs for pair heads only
        tasks = side.select(list(dict.fromkeys(tasks)) if tasks is not None else None, text_pairs is not None)
        tokens = sum(await asyncio.to_thread(side.count_tokens, texts, tasks, text_pairs))
    except DataError as e:
        raise HTTPException(422, str(e)) from None
    if tokens > cfg.max_tokens:
        raise HTTPException(413, f"the request needs {tokens} tokens (with token-head windows); the limit is "
                                 f"{cfg.max_tokens} (--max-tokens)")
    if await request.is_disconnected():  # hung up while it was being checked: never queued, never run
        batcher.gone += 1
        batcher.dropped += 1
        raise HTTPException(499, "client disconnected")  # never sent
    try:
        job = batcher.submit(texts, tasks, tokens, text_pairs)
    except Busy:
        raise HTTPException(503, f"the queue is full ({batcher.max_queue} requests pending, --max-queue); "
                                 "retry later", headers={"Retry-After": str(batcher.retry_after_s())}) from None
    gone = asyncio.create_task(client_gone(request))
    try:
        left = cfg.request_timeout_s - (time.perf_counter() - arrived)
        await asyncio.wait({job.future, gone}, timeout=max(0.0, left), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not job.future.done():
        job.future.cancel()  # the batcher drops it unrun
        if gone.done() and not gone.cancelled():
            batcher.gone += 1
            raise HTTPException(499, "client disconnected")  # never sent
        batcher.expired += 1
        raise HTTPException(503, f"not answered within {cfg.request_timeout_s:g} s (--request-timeout); "
                                 "retry later", headers={"Retry-After": str(batcher.retry_after_s())})
    try:
        return job.future.result(), tokens
    except DataError as e:
        raise HTTPException(422, str(e)) from None
    except AdaLayersError as e:
        raise HTTPException(500, f"server-side error: {e}") from None
    except Exception as e:  # noqa: BLE001  (logged by the batcher)
        raise HTTPException(500, f"server-side error ({type(e).__name__}); see the server log") from None


def create_app(side: SideTasks, cfg: ServeConfig | None = None, api_key: str | None = None,
               batcher=None) -> FastAPI:
    """The app; `batcher` (submit -> _Job, run, queue, counters) defaults to Batcher, Ray Serve passes its own."""
    cfg = cfg or ServeConfig()
    batcher = batcher or Batcher(side, max(1, cfg.max_batch), max(0.0, cfg.max_wait_ms) / 1000,
                                 max(1, cfg.max_batch_tokens), max(1, cfg.max_queue))
    max_body = max_body_bytes(cfg)  # larger than any valid request: refused unread

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        if isinstance(batcher, Batcher):
            batcher.queue = asyncio.Queue()  # bound to the server's event loop (Ray Serve's batcher has none)
        worker = asyncio.create_task(batcher.run())
        yield
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker

    # FastAPIOffline: /docs and /redoc load Swagger UI / ReDoc from the package, not from a CDN (air-gapped)
    app = FastAPIOffline(title="adalayers", version="0.1.0", lifespan=lifespan,
                  description=f"Side tasks on {public_name(side.backbone.name)}, all answered from one pass of the base.")
    app.state.batcher, app.state.side, app.state.started = batcher, side, time.time()
    app.add_middleware(BodyLimit, max_bytes=max_body,
                       hint=f" (from --max-texts {cfg.max_texts} and --max-chars {cfg.max_chars})")
    if api_key:
        app.add_middleware(BearerAuth, key=api_key)  # added last: runs first, before any body is read

    add_error_handlers(app)  # 4xx answers that echo client input (NaN, lone surrogates, deep JSON) stay 4xx

    @app.post("/predict", response_model=PredictResponse,
              responses={401: {"description": "API key missing or wrong"}, 408: {"description": "read timeout"},
                         413: {"description": "too large"}, 422: {"description": "invalid input"},
                         503: {"description": "queue full or deadline passed; see Retry-After"}})
    async def predict(req: PredictRequest, request: Request):
        arrived = time.perf_counter()
        if not req.texts:
            raise HTTPException(422, "texts is empty: give at least one text")
        if len(req.texts) > cfg.max_texts:
            raise HTTPException(413, f"{len(req.texts)} texts in one request; the limit is {cfg.max_texts} "
                                     f"(--max-texts)")
        texts, text_pairs = _split_pairs(req)
        results, _ = await answer_texts(side, batcher, cfg, request, arrived, texts, text_pairs, req.tasks)
        if not req.base:
            for r in results:
                r.pop("base", None)
        return {"results": results}

    from adalayers.serve.routers.generate import add_generate_routes
    add_generate_routes(app, side, cfg)  # POST /generate, /generate/stream (decoder LLM bases)
    if cfg.ui:
        add_ui_routes(app)  # GET /: the playground page (serve/routers/ui.py)
    from adalayers.serve.routers.openai import add_openai_routes
    add_openai_routes(app, side, cfg, public_name(side.backbone.name), answer_texts)  # /v1/* (OpenAI, vLLM)

    @app.get("/tasks")
    async def tasks():
        return {"base": public_name(side.backbone.name), "fingerprint": side.backbone.fingerprint(), "primary": side.primary,
                "max_length": side.max_length, "tasks": side.describe(),
                "generates": side.backbone.is_causal}  # a decoder LLM: /generate and /generate/stream answer

    @app.get("/health")
    async def health():
        return {"status": "ok", "base": public_name(side.backbone.name), "tasks": side.names,
                "queued": batcher.queue.qsize(), "pending": batcher.pending, "batches_run": batcher.passes, "requests_answered": batcher.requests,
                "requests_dropped": batcher.dropped, "requests_refused": batcher.refused,
                "clients_gone": batcher.gone, "deadlines_passed": batcher.expired, "busy": batcher.busy,
                "largest_batch_tokens": batcher.largest_tokens, "base_rows_run": side.rows_run,
                "base_rows_skipped": side.rows_skipped,
                "generations_stopped": getattr(batcher, "generations_stopped", 0), "max_batch_tokens": batcher.max_batch_tokens,
                "max_batch": batcher.max_batch, "max_wait_ms": batcher.max_wait_s * 1000,
                "uptime_s": round(time.time() - app.state.started, 1), "memory": process_memory()}

    return app
