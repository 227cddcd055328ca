"""HTTP routes for generation with side tasks (a decoder LLM base):

    POST /generate         {"prompts": [...], "max_new_tokens": 32, "tasks": [...], ...}
                           -> {"results": [one object per prompt, as SideTasks.generate returns]}
    POST /generate/stream  the same body; server-sent events: "prompt" (the prompt's side outputs,
                           from the prefill), one "step" per generated token (its text per prompt and
                           the per-step values of sequence heads), then "done" (the full results).

Same limits and text rules as /predict (serve/validate.py: --max-texts prompts of at most --max-chars
characters, no lone surrogates or blank prompts; no NaN/Infinity; body limit, API key and read timeout from the
app), max_new_tokens at most MAX_NEW_TOKENS (and the context, --ctx-size); a bad request is answered 4xx with
one line naming the problem before any token is generated. Both routes go through the generation service
(serve/generation.py): counted under --max-queue as a /predict request is (503 when full; a stream while it
streams); POST /generate is bounded by --request-timeout (503) and a stream's first event (its prefill, after
any wait for room) too; a client that leaves stops the generation at the next decode step. Concurrent requests
share decode steps (serve/scheduler.py; ServeState.decode) unless --no-continuous-batching.
"""
from __future__ import annotations

import time
from typing import Iterator

from fastapi import FastAPI, Request

from adalayers.errors import AdaLayersError
from adalayers.serve.errors import BadRequest
from adalayers.serve.generation import frame, with_first
from adalayers.serve.params import generate_params
from adalayers.serve.protocol import GenerateRequest
from adalayers.serve.state import ServeState
from adalayers.serve.validate import check_count, check_tasks, check_texts


def _check(req: GenerateRequest, side, cfg) -> None:
    check_count(req.prompts, cfg.max_texts, "prompts", "prompt")
    check_texts(req.prompts, cfg.max_chars, "prompt")  # the /predict rule: lone surrogates, NUL/zero-width-only
    check_tasks(side, (req.tasks or []) + req.answer_only + list(req.guard or {}))
    if not side.backbone.is_causal:
        raise BadRequest(f"the base {side.backbone.name} is not a decoder LLM: it cannot generate")


def _results(events: Iterator[dict]) -> list[dict]:
    for event in events:
        if event["event"] == "done":
            return event["results"]
    raise AdaLayersError("generation ended without a result")


def _frames(first: dict, events: Iterator[dict]) -> Iterator[str]:
    for event in with_first(first, events):
        yield frame({k: v for k, v in event.items() if k != "event"}, event["event"])


def add_routes(app: FastAPI, state: ServeState) -> None:
    side, cfg, service = state.side, state.cfg, state.generation  # the /v1 routes generate through it too

    @app.post("/generate")
    async def generate(req: GenerateRequest, request: Request):
        """Counted under --max-queue and bounded by --request-timeout as /predict is; a client that leaves
        (or a deadline that passes) stops the generation at its next decode step."""
        arrived = time.perf_counter()
        _check(req, side, cfg)
        started = await service.begin(req.prompts, generate_params(req, cfg.ctx_size), "/generate", arrived,
                                      request=request)
        return {"results": await service.finish(started, _results, arrived, request)}

    @app.post("/generate/stream")
    async def generate_stream(req: GenerateRequest):
        """Counted under --max-queue while it streams, as /generate is; its first event (the prefill, after
        any wait for room) within --request-timeout, else 503; a client that leaves ends it at the next step."""
        arrived = time.perf_counter()
        _check(req, side, cfg)
        started = await service.begin(req.prompts, generate_params(req, cfg.ctx_size), "/generate/stream", arrived)
        return service.sse(started, _frames)
