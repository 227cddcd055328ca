"""The HTTP service: a FastAPI app around one SideTasks, laid out as the OpenAI-style servers are.

    serve/app.py         create_app: the app, its middlewares, and every router, one line each
    serve/state.py       ServeState: what the routers share (heads, settings, batcher, decoder)
    serve/batcher.py     the micro-batching queue of /predict-like work
    serve/protocol.py    every request and response model
    serve/config.py      ServeConfig: the settings (each one a flag of `adalayers serve`)
    serve/limits.py      body size, read time, JSON hygiene;  serve/auth.py  the API key
    serve/budget.py      values per body, counted before parsing; bodies of clients already gone dropped
    serve/routers/       one module per endpoint group, each with add_routes(app, state):
        predict.py       POST /predict, GET /tasks
        health.py        GET /health (liveness, counters, memory; open even when an API key is set)
        generate.py      POST /generate, /generate/stream (decoder LLM bases)
        openai.py        GET /v1/models, POST /v1/chat/completions, /v1/completions (OpenAI-compatible)
        pooling.py       POST /v1/classify (vLLM's shape), /v1/embeddings (OpenAI's)
        ui.py            GET /: the playground page (ServeConfig.ui; --no-ui leaves it out)

GET /openapi.json, /docs and /redoc load their scripts from the package (no CDN). A new endpoint group
is a new module in routers/ with add_routes(app, state), and one entry in ROUTERS.
"""
from __future__ import annotations

import asyncio
import contextlib

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline

from adalayers.infer.sidetasks import SideTasks
from adalayers.serve.auth import BearerAuth
from adalayers.serve.batcher import Batcher
from adalayers.serve.budget import JsonBudget, max_json_items, max_json_values
from adalayers.serve.config import ServeConfig
from adalayers.serve.limits import BodyLimit, add_error_handlers, max_body_bytes
from adalayers.serve.routers import generate, health, openai, pooling, predict, ui
from adalayers.serve.state import ServeState

# in this order: the /v1 routers add their error-shaping middleware after the app's own (outermost)
ROUTERS = (predict, generate, ui, openai, pooling, health)


def create_app(side: SideTasks, cfg: ServeConfig | None = None, api_key: str | None = None,
               batcher=None) -> FastAPI:
    """The app; `batcher` (submit -> Job, run, queue, counters) defaults to Batcher, Ray Serve passes its own."""
    state = ServeState.build(side, cfg or ServeConfig(), batcher)
    # FastAPIOffline: /docs and /redoc load Swagger UI / ReDoc from the package, not from a CDN (air-gapped)
    app = FastAPIOffline(title="adalayers", version="0.1.0", lifespan=_lifespan(state.batcher),
                         description=f"Side tasks on {state.name}, all answered from one pass of the base.")
    app.state.serve, app.state.batcher, app.state.side = state, state.batcher, side
    app.add_middleware(JsonBudget, max_items=max_json_items(state.cfg),  # inside BodyLimit: scans what it let in
                       max_values=max_json_values(state.cfg), counters=state.batcher)
    app.add_middleware(BodyLimit, max_bytes=max_body_bytes(state.cfg),  # larger than any valid request: unread
                       hint=f" (from --max-texts {state.cfg.max_texts} and --max-chars {state.cfg.max_chars})")
    if api_key:
        app.add_middleware(BearerAuth, key=api_key)  # added after BodyLimit: runs first, before any body is read
    add_error_handlers(app)  # 4xx answers that echo client input (NaN, lone surrogates, deep JSON) stay 4xx
    for router in ROUTERS:
        router.add_routes(app, state)
    return app


def _lifespan(batcher):
    """Runs the batcher's worker while the server runs."""
    @contextlib.asynccontextmanager
    async def lifespan(_app):
        if isinstance(batcher, Batcher):
            batcher.bind()  # its queue on the server's event loop (Ray Serve's batcher has none)
        worker = asyncio.create_task(batcher.run())
        yield
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
    return lifespan
