"""The HTTP service: FastAPI app around one SideTasks, with micro-batching of concurrent requests.

    POST /predict  {"texts": [...], "tasks": [...optional subset...]}  -> {"results": [one object per text]}
                   sentence pairs: {"texts": [["a", "b"], ...]} or {"texts": ["a", ...], "text_pairs": ["b", ...]}
    GET  /tasks    the heads: names, kinds, labels, layer weights
    GET  /health   liveness and counters
    GET  /openapi.json, /docs

Requests wait in an asyncio queue; one worker takes the first, gathers whatever else arrives
within max_wait_ms (up to max_batch texts), and runs them as one base pass in a thread, so the
event loop keeps accepting requests while the model runs.
"""
from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from adalayers.config import ServeConfig
from adalayers.errors import DataError
from adalayers.serve.api import SideTasks


class PredictRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    texts: list[str | list[str]] = Field(description="Texts to run; each is split into words on whitespace for token "
                                                     "tasks. For heads trained on sentence pairs: [text, second] "
                                                     "lists, or texts plus text_pairs.")
    text_pairs: list[str] | None = Field(None, description="The second text of each text, for heads trained on "
                                                           "sentence pairs (or give [text, second] lists in texts).")
    tasks: list[str] | None = Field(None, description="Names of the side tasks to answer (default: all).")
    base: bool = Field(True, description="Include the base model's own output (e.g. its sentence embedding).")


class PredictResponse(BaseModel):
    results: list[dict] = Field(description="Per text: truncated, base (its own output) and tasks {name: prediction}.")


@dataclass
class _Job:
    texts: list[str]
    tasks: list[str]
    future: asyncio.Future
    text_pairs: list[str] | None = None


@dataclass
class Batcher:
    """Gathers concurrent requests into batches of at most max_batch texts and runs them in a thread."""
    side: SideTasks
    max_batch: int
    max_wait_s: float
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    passes: int = 0      # groups run (each is one predict call: one base pass per max_batch texts)
    requests: int = 0

    async def submit(self, texts: list[str], tasks: list[str], text_pairs: list[str] | None = None) -> list[dict]:
        job = _Job(texts, tasks, asyncio.get_running_loop().create_future(), text_pairs)
        await self.queue.put(job)
        return await job.future

    async def run(self) -> None:
        loop, carry = asyncio.get_running_loop(), None
        while True:
            group = [carry or await self.queue.get()]
            carry, n = None, len(group[0].texts)
            deadline = loop.time() + self.max_wait_s
            while n < self.max_batch:
                try:
                    left = deadline - loop.time()
                    job = self.queue.get_nowait() if left <= 0 else await asyncio.wait_for(self.queue.get(), left)
                except (asyncio.QueueEmpty, asyncio.TimeoutError):
                    break
                if n + len(job.texts) > self.max_batch:
                    carry = job  # starts the next group
                    break
                group.append(job)
                n += len(job.texts)
            await self._run_group(group)

    async def _run_group(self, group: list[_Job]) -> None:
        """Single texts and sentence pairs of one group go to the base as two predict calls."""
        for pairs in (False, True):
            part = [job for job in group if (job.text_pairs is not None) == pairs]
            if part:
                await self._run_part(part, pairs)

    async def _run_part(self, group: list[_Job], pairs: bool) -> None:
        try:
            answers = await asyncio.to_thread(predict_group, self.side,
                                              [(job.texts, job.tasks, job.text_pairs) for job in group])
        except Exception as e:  # noqa: BLE001  (handed to the waiting requests, answered 500)
            for job in group:
                if not job.future.done():
                    job.future.set_exception(e)
            return
        self.passes += 1
        self.requests += len(group)
        for job, mine in zip(group, answers):
            if not job.future.done():
                job.future.set_result(mine)


def predict_group(side: SideTasks, group: list[tuple[list[str], list[str], list[str] | None]]) -> list[list[dict]]:
    """Requests (texts, tasks, text_pairs) of one kind (all single texts, or all sentence pairs) as one
    SideTasks.predict call, one base pass per batch; each request gets its own results with its own tasks.
    The uvicorn Batcher and the Ray Serve batch (serve/ray_serve.py) both answer through this."""
    texts = [t for texts, _, _ in group for t in texts]
    second = [t for _, _, pairs in group for t in pairs] if group[0][2] is not None else None
    results = side.predict(texts, list(dict.fromkeys(name for _, tasks, _ in group for name in tasks)), second)
    answers, start = [], 0
    for texts, tasks, _ in group:
        mine = results[start: start + len(texts)]
        start += len(texts)
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


def create_app(side: SideTasks, cfg: ServeConfig | None = None, batcher=None) -> FastAPI:
    """The app; `batcher` (submit, run, queue, counters) defaults to Batcher, Ray Serve passes its own."""
    cfg = cfg or ServeConfig()
    batcher = batcher or Batcher(side, max(1, cfg.max_batch), max(0.0, cfg.max_wait_ms) / 1000)
    # a body bigger than the largest valid request (JSON may escape a character as 6 bytes) is refused unread
    max_body = cfg.max_texts * (cfg.max_chars * 6 + 16) + 4096

    @contextlib.asynccontextmanager
    async def lifespan(_app):
        worker = asyncio.create_task(batcher.run())
        yield
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker

    app = FastAPI(title="adalayers", version="0.1.0", lifespan=lifespan,
                  description=f"Side tasks on {side.backbone.name}, all answered from one pass of the base.")
    app.state.batcher, app.state.side, app.state.started = batcher, side, time.time()

    @app.middleware("http")
    async def body_limit(request: Request, call_next):
        size = request.headers.get("content-length")
        if size and size.isdigit() and int(size) > max_body:
            return JSONResponse(status_code=413, content={"detail": f"request body has {size} bytes; the limit is "
                                f"{max_body} (from --max-texts {cfg.max_texts} and --max-chars {cfg.max_chars})"})
        return await call_next(request)

    @app.post("/predict", response_model=PredictResponse)
    async def predict(req: PredictRequest):
        if not req.texts:
            raise HTTPException(422, "texts is empty: give at least one text")
        if len(req.texts) > cfg.max_texts:
            raise HTTPException(413, f"{len(req.texts)} texts in one request; the limit is {cfg.max_texts} "
                                     f"(--max-texts)")
        texts, text_pairs = _split_pairs(req)
        for what, given in (("text", texts), ("second text", text_pairs or [])):
            for i, t in enumerate(given):
                if len(t) > cfg.max_chars:
                    raise HTTPException(413, f"{what} {i + 1} has {len(t)} characters; the limit is "
                                             f"{cfg.max_chars} (--max-chars)")
                if not t.strip():
                    raise HTTPException(422, f"{what} {i + 1} is empty")
        unknown = [t for t in (req.tasks or []) if t not in side.heads]
        if unknown:
            raise HTTPException(400, f"unknown task(s): {', '.join(unknown)}; known tasks: {', '.join(side.names)}")
        try:  # the named heads (or, by default, those that take this input): pairs for pair heads only
            tasks = side.select(list(dict.fromkeys(req.tasks)) if req.tasks is not None else None,
                                text_pairs is not None)
        except DataError as e:
            raise HTTPException(422, str(e)) from None
        results = await batcher.submit(texts, tasks, text_pairs)
        if not req.base:
            for r in results:
                r.pop("base", None)
        return {"results": results}

    from adalayers.serve.generate_routes import add_generate_routes
    add_generate_routes(app, side, cfg)  # POST /generate, /generate/stream (decoder LLM bases)

    @app.get("/tasks")
    async def tasks():
        return {"base": side.backbone.name, "fingerprint": side.backbone.fingerprint(), "primary": side.primary,
                "max_length": side.max_length, "tasks": side.describe()}

    @app.get("/health")
    async def health():
        return {"status": "ok", "base": side.backbone.name, "tasks": side.names,
                "queued": batcher.queue.qsize(), "batches_run": batcher.passes, "requests_answered": batcher.requests,
                "max_batch": batcher.max_batch, "max_wait_ms": batcher.max_wait_s * 1000,
                "uptime_s": round(time.time() - app.state.started, 1)}

    return app
