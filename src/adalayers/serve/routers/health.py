"""GET /health: liveness, the batcher's counters and the process's memory (serve/memory.py).

Open even when an API key is set (auth.OPEN_PATHS), so that a load balancer can probe it.
"""
from __future__ import annotations

import time

from fastapi import FastAPI

from adalayers.serve.memory import process_memory
from adalayers.serve.state import ServeState


def add_routes(app: FastAPI, state: ServeState) -> None:
    @app.get("/health")
    async def health():
        return {"status": "ok", "base": state.name, "tasks": state.side.names, **counters(state),
                "uptime_s": round(time.time() - state.started, 1), "memory": process_memory()}


def counters(state: ServeState) -> dict:
    """What the batcher and the base have done so far, and the batching settings."""
    b, side = state.batcher, state.side
    return {"queued": b.queue.qsize(), "pending": b.pending, "batches_run": b.passes, "requests_answered": b.requests,
            "requests_dropped": b.dropped, "requests_refused": b.refused, "clients_gone": b.gone,
            "deadlines_passed": b.expired, "busy": b.busy, "largest_batch_tokens": b.largest_tokens,
            "base_rows_run": side.rows_run, "base_rows_skipped": side.rows_skipped,
            "generations_stopped": b.generations_stopped, "max_batch_tokens": b.max_batch_tokens,
            "max_batch": b.max_batch, "max_wait_ms": b.max_wait_s * 1000,
            "requests_sliced": b.sliced, "base_tokens_per_s": round(b.tokens_per_s, 1),
            "checks_waiting": state.checks.waiting(), "checks_skipped": state.checks.skipped,
            **(state.scheduler.stats() if state.scheduler is not None else {}), **side.runtime.usage(),
            "guard_stops": state.guards.stats() if state.guards is not None else {}}
