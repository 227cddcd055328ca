"""HTTP routes for generation with side tasks (a decoder LLM base):

    POST /generate         {"prompts": [...], "max_new_tokens": 32, "tasks": [...], ...}
                           -> {"results": [one object per prompt, as SideTasks.generate returns]}
    POST /generate/stream  the same body; server-sent events: "prompt" (the prompt's side outputs,
                           from the prefill), one "step" per generated token (its text per prompt and
                           the per-step values of sequence heads), then "done" (the full results).

Same limits and text rules as /predict (--max-texts prompts of at most --max-chars characters, no
lone surrogates or blank prompts, no NaN/Infinity; body limit, API key and read timeout from the app), max_new_tokens at
most MAX_NEW_TOKENS; a bad request is answered 4xx with one line naming the problem before any
token is generated. A client that leaves a stream stops its generation at the next token. Both routes
count under --max-queue as a /predict request does (503 when full; a stream while it streams); POST /generate
is bounded by --request-timeout (503) and a stream's first event (its prefill, after any wait for room)
too; a client that leaves stops the generation at the next decode step. Concurrent requests share decode
steps (serve/scheduler.py; ServeState.decode) unless --no-continuous-batching.
"""
from __future__ import annotations

import asyncio
import json
import threading
import time
import weakref

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse, StreamingResponse

from adalayers.errors import AdaLayersError, Cancelled, ModelError
from adalayers.serve.deadlines import within
from adalayers.serve.limits import client_gone
from adalayers.serve.protocol import GenerateRequest
from adalayers.serve.state import ServeState
from adalayers.textcheck import text_problem


def _check(req: GenerateRequest, side, cfg) -> None:
    if not req.prompts:
        raise HTTPException(422, "prompts is empty: give at least one prompt")
    if len(req.prompts) > cfg.max_texts:
        raise HTTPException(413, f"{len(req.prompts)} prompts in one request; the limit is {cfg.max_texts} "
                                 f"(--max-texts)")
    for i, p in enumerate(req.prompts):
        if len(p) > cfg.max_chars:
            raise HTTPException(413, f"prompt {i + 1} has {len(p)} characters; the limit is {cfg.max_chars} "
                                     f"(--max-chars)")
        problem = text_problem(p)  # the /predict rule: lone surrogates, NUL/zero-width-only prompts
        if problem:
            raise HTTPException(422, f"prompt {i + 1} {problem}")
    unknown = [t for t in (req.tasks or []) + req.answer_only + list(req.guard or {}) if t not in side.heads]
    if unknown:
        raise HTTPException(400, f"unknown task(s): {', '.join(unknown)}; known tasks: {', '.join(side.names)}")
    if not side.backbone.is_causal:
        raise HTTPException(400, f"the base {side.backbone.name} is not a decoder LLM: it cannot generate")


def _kwargs(req: GenerateRequest) -> dict:
    return dict(max_new_tokens=req.max_new_tokens, tasks=req.tasks, do_sample=req.do_sample,
                temperature=req.temperature, top_k=req.top_k, seed=req.seed, steps=req.steps,
                answer_only=req.answer_only, guard={n: (g.label, g.threshold) for n, g in (req.guard or {}).items()})


def _until_done(events, stop: threading.Event) -> list[dict]:
    """Run a generation's events to its results, stopping at the next decode step once `stop` is set."""
    try:
        for event in events:
            if stop.is_set():
                raise Cancelled("nobody waits for this generation any more")
            if event["event"] == "done":
                return event["results"]
    finally:
        events.close()
    raise AdaLayersError("generation ended without a result")


def add_routes(app: FastAPI, state: ServeState) -> None:
    side, cfg, decode = state.side, state.cfg, state.decode  # the /v1 routes generate through the same decode

    @app.post("/generate")
    async def generate(req: GenerateRequest, request: Request):
        """Counted under --max-queue and bounded by --request-timeout as /predict is; a client that leaves
        (or a deadline that passes) stops the generation at its next decode step."""
        arrived, batcher = time.perf_counter(), state.batcher
        _check(req, side, cfg)
        try:  # the scheduler checks a request as it takes it: a bad one is a 400 before it counts or runs
            events = decode(req.prompts, route="/generate", **_kwargs(req))
        except (ModelError, AdaLayersError) as e:
            raise HTTPException(400, str(e)) from None
        release = batcher.admit() if hasattr(batcher, "admit") else (lambda: None)
        if release is None:
            events.close()
            raise state.busy()
        stop = threading.Event()
        work = asyncio.ensure_future(asyncio.to_thread(_until_done, events, stop))
        work.add_done_callback(lambda f: (release(), f.cancelled() or f.exception()))  # pending until it stops
        gone = asyncio.create_task(client_gone(request))
        try:
            left = cfg.request_timeout_s - (time.perf_counter() - arrived)
            await asyncio.wait({work, gone}, timeout=max(0.0, left), return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not work.done():
            stop.set()
            events.cancel("nobody waits for this generation any more")  # also when it still waits for room
            batcher.generations_stopped = getattr(batcher, "generations_stopped", 0) + 1
            if gone.done() and not gone.cancelled():
                return JSONResponse(status_code=499, content={"detail": "client disconnected"})  # never sent
            raise state.expired()
        try:
            return {"results": work.result()}
        except (ModelError, AdaLayersError) as e:
            raise HTTPException(400, str(e)) from None

    @app.post("/generate/stream")
    async def generate_stream(req: GenerateRequest):
        """Counted under --max-queue while it streams, as /generate is; its first event (the prefill, after
        any wait for room) within --request-timeout, else 503; a client that leaves ends it at the next step."""
        arrived, batcher = time.perf_counter(), state.batcher
        _check(req, side, cfg)
        try:
            events = decode(req.prompts, route="/generate/stream", **_kwargs(req))
        except (ModelError, AdaLayersError) as e:
            raise HTTPException(400, str(e)) from None
        release = batcher.admit() if hasattr(batcher, "admit") else (lambda: None)
        if release is None:
            events.close()
            raise state.busy()

        def finish():
            events.close()
            release()
        try:  # the prefill runs here: a bad request is still answered 4xx, not inside the stream
            left = cfg.request_timeout_s - (time.perf_counter() - arrived)
            ok, first = await within(lambda: next(events), events, left, finish)
        except (ModelError, AdaLayersError) as e:
            finish()
            raise HTTPException(400, str(e)) from None
        if not ok:
            batcher.generations_stopped = getattr(batcher, "generations_stopped", 0) + 1
            raise state.expired()

        def sse():  # iterated in a worker thread by Starlette; closing it ends the generation
            try:
                yield _sse(first)
                for event in events:
                    yield _sse(event)
            finally:
                finish()

        body = sse()
        weakref.finalize(body, release)  # a stream never started still gives its slot back
        return StreamingResponse(body, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _sse(event: dict) -> str:
    body = {k: v for k, v in event.items() if k != "event"}
    return f"event: {event['event']}\ndata: {json.dumps(body)}\n\n"
