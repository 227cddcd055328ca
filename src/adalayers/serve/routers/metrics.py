"""GET /metrics: the service's Prometheus metrics (serve/metrics.py) in Prometheus' text format, and the
middleware that counts every HTTP answer by route and status (outermost: it sees the API key's 401 and the
body limit's 413 too). Behind the API key when one is set, as llama-server's /metrics.
"""
from __future__ import annotations

from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST

from adalayers.serve.metrics import Metrics
from adalayers.serve.state import ServeState


def add_routes(app: FastAPI, state: ServeState) -> None:
    batcher, scheduler = state.batcher, state.scheduler
    state.metrics.count_waiting(lambda: batcher.queue.qsize() + (scheduler.stats()["generations_waiting"]
                                                                 if scheduler is not None else 0))
    app.add_middleware(CountAnswers, metrics=state.metrics)

    @app.get("/metrics", include_in_schema=False)
    async def metrics():
        return Response(state.metrics.exposition(), media_type=CONTENT_TYPE_LATEST)


class CountAnswers:
    """ASGI middleware: Metrics.request(route, status) once per HTTP answer. The route is the matched route's
    template path (FastAPI puts the route in the scope), "unmatched" for a path no route has."""

    def __init__(self, app, metrics: Metrics):
        self.app, self.metrics = app, metrics

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        status = [500]

        async def counting_send(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, counting_send)
        finally:
            route = scope.get("route")
            self.metrics.request(getattr(route, "path", None) or "unmatched", status[0])
