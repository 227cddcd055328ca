"""The HTTP service: a FastAPI app around one predictor (SideTasks, or GgufPredictor on the torch-free path), laid out as the OpenAI-style servers are.

    serve/app.py         create_app: the app, its middlewares, and every router, one line each
    serve/state.py       ServeState: what the routers share (heads, settings, batcher, decoder)
    serve/batching.py    the Batcher protocol (and what both batchers share);  serve/batcher.py  the
                         micro-batching queue of /predict-like work (MicroBatcher)
    serve/generation.py  the generation service: the one path of /generate, /generate/stream and /v1 generation
    serve/params.py      GenerationParams from any route's request;  serve/validate.py  limits, text rules, tasks
    serve/errors.py      the typed errors of a request and their two shapes (native, OpenAI's)
    serve/protocol.py    every request and response model
    serve/config.py      ServeConfig: the settings (each one a flag of `adalayers serve`)
    serve/limits.py      body size, read time, JSON hygiene;  serve/auth.py  the API key
    serve/budget.py      values per body, counted before parsing; bodies of clients already gone dropped
    serve/routers/       one module per endpoint group, each with add_routes(app, state):
        predict.py       POST /predict, GET /tasks
        health.py        GET /health (liveness, counters, memory; open even when an API key is set)
        metrics.py       GET /metrics (Prometheus' text format; serve/metrics.py), every answer counted
        generate.py      POST /generate, /generate/stream (decoder LLM bases)
        openai.py        GET /v1/models, POST /v1/chat/completions, /v1/completions (OpenAI-compatible)
        pooling.py       POST /v1/classify (vLLM's shape), /v1/embeddings (OpenAI's)
        ui.py            GET /: the playground page (ServeConfig.ui; --no-ui leaves it out)

GET /openapi.json, /docs and /redoc load their scripts from the package (no CDN). A new endpoint group
is a new module in routers/ with add_routes(app, state), and one entry in ROUTERS.

`adalayers serve` binds first and loads after (Loading, as llama-server does): until the base and heads are
loaded every request is answered 503 (GET /health: {"status": "loading"}), then the app above answers.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import threading
from typing import Callable

from fastapi import FastAPI
from fastapi_offline import FastAPIOffline

from adalayers.infer.predictor_base import PredictorBase
from adalayers.serve.auth import BearerAuth
from adalayers.serve.batching import Batcher
from adalayers.serve.budget import JsonBudget, max_json_items, max_json_values
from adalayers.serve.config import ServeConfig
from adalayers.serve.errors import add_error_handlers
from adalayers.serve.limits import BodyLimit, max_body_bytes
from adalayers.serve.memory import freeze_loaded
from adalayers.serve.routers import generate, health, metrics, openai, pooling, predict, ui
from adalayers.serve.state import ServeState

log = logging.getLogger(__name__)

# in this order: metrics' counting middleware comes last (outermost: it sees every answer)
ROUTERS = (predict, generate, ui, openai, pooling, health, metrics)


def create_app(side: PredictorBase, cfg: ServeConfig | None = None, api_key: str | None = None,
               batcher: Batcher | None = None) -> FastAPI:
    """The app; `batcher` (serve/batching.Batcher) defaults to MicroBatcher, Ray Serve passes its own."""
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
    add_error_handlers(app)  # native error shape; 4xx answers that echo client input (NaN, lone surrogates) stay 4xx
    for router in ROUTERS:
        router.add_routes(app, state)
    return app


def _lifespan(batcher: Batcher):
    """Runs the batcher's worker while the server runs."""
    @contextlib.asynccontextmanager
    async def lifespan(_app):
        batcher.bind()  # its queue on the server's event loop (Ray Serve's batcher has none)
        worker = asyncio.create_task(batcher.run())
        yield
        worker.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await worker
    return lifespan


class Loading:
    """An ASGI app that answers at once and becomes `build(load())` once load() has run (in a thread, after the
    server's startup): until then every HTTP request is a 503 with Retry-After (GET /health: {"status":
    "loading"}, as llama-server's). The built app's own lifespan (its batcher's worker) runs from then until
    shutdown. on_ready(side) runs once it answers; a failing load calls on_failure(error) (the CLI stops the
    server and reports the error) and keeps answering 503."""

    def __init__(self, load: Callable[[], PredictorBase], build: Callable[[PredictorBase], FastAPI],
                 on_ready: Callable[[PredictorBase], None] = lambda side: None,
                 on_failure: Callable[[BaseException], None] = lambda error: None):
        self.load, self.build, self.on_ready, self.on_failure = load, build, on_ready, on_failure
        self.app: FastAPI | None = None
        self.error: BaseException | None = None
        self._task: asyncio.Task | None = None

    async def __call__(self, scope, receive, send):
        if scope["type"] == "lifespan":
            return await self._lifespan(receive, send)
        if self.app is not None:
            return await self.app(scope, receive, send)
        if scope["type"] != "http":
            return await send({"type": "websocket.close", "code": 1013})
        loading = scope["path"] == "/health"
        body = json.dumps({"status": "loading"} if loading else
                          {"error": {"message": "the model is loading; retry later", "type": "unavailable_error",
                                     "param": None, "code": 503}}).encode()
        await send({"type": "http.response.start", "status": 503,
                    "headers": [(b"content-type", b"application/json"), (b"retry-after", b"1"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def _lifespan(self, receive, send) -> None:
        stop = asyncio.Event()
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                self._task = asyncio.create_task(self._serve(stop))
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                stop.set()
                if self._task is not None:
                    with contextlib.suppress(asyncio.CancelledError):
                        await self._task
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _serve(self, stop: asyncio.Event) -> None:
        loop, loaded = asyncio.get_running_loop(), asyncio.get_running_loop().create_future()

        def load():  # a daemon thread: a server stopped while loading exits without waiting for the load
            try:
                side = self.load()
                loop.call_soon_threadsafe(lambda side=side: loaded.done() or loaded.set_result(side))
            except BaseException as e:  # noqa: BLE001  (handed to the event loop)
                loop.call_soon_threadsafe(lambda error=e: loaded.done() or loaded.set_exception(error))

        threading.Thread(target=load, name="adalayers-load", daemon=True).start()
        waiter = asyncio.ensure_future(stop.wait())
        await asyncio.wait({loaded, waiter}, return_when=asyncio.FIRST_COMPLETED)
        if not loaded.done():
            return  # shut down while loading
        waiter.cancel()
        try:
            app = self.build(loaded.result())
        except BaseException as e:  # noqa: BLE001
            self.error = e
            self.on_failure(e)
            return
        log.info("%d loaded objects out of the garbage collector's view", freeze_loaded())
        async with app.router.lifespan_context(app):
            self.app = app
            self.on_ready(app.state.side)
            await stop.wait()
