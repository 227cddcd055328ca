"""`adalayers serve --engine ray`: the same FastAPI app (serve/app.py) as a Ray Serve deployment.

Each replica loads the base and heads once and builds the app with create_app, so endpoints, limits and
error answers are the uvicorn path's own. Only the batcher differs: Ray Serve's @serve.batch gathers
up to max_batch concurrent requests (waiting at most max_wait_ms), and predict_group runs them as one
SideTasks.predict call (one base pass per max_batch texts; sentence pairs in a call of their own). Ray Serve's proxy receives HTTP on
host:port (127.0.0.1 by default) and spreads requests over `num_replicas` replicas, or between
autoscaling bounds. Health: Ray Serve calls check_health on every replica and replaces a failing one;
shutdown (SIGINT/SIGTERM to `adalayers serve`) is serve.shutdown(): replicas finish their requests
within graceful_shutdown_timeout_s.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import time

from ray import serve

from adalayers import runtimes
from adalayers.serve.batching import Admits, Busy, Job, each_alone, predict_group
from adalayers.serve.config import ServeConfig

log = logging.getLogger(__name__)


class _Pending:
    """The waiting requests, read by /health as `queued` (the uvicorn Batcher's queue.qsize())."""

    def __init__(self):
        self.n = 0

    def qsize(self) -> int:
        return self.n


class ServeBatcher(Admits):
    """The Batcher (serve/batching.py) of a Ray Serve replica, backed by a @serve.batch method instead of an
    asyncio queue. The hardening of the uvicorn MicroBatcher applies here too: at most max_queue requests
    pending, generations counted too (Busy -> 503 with Retry-After), a request cancelled at its deadline or on a
    disconnect no longer counts, and a failing batch is rerun one request at a time (batching.each_alone) so that
    only the faulty request gets the error."""

    def __init__(self, batched, max_batch: int, max_wait_s: float, max_batch_tokens: int = 16_384,
                 max_queue: int = 64):
        self.batched, self.max_batch, self.max_wait_s = batched, max_batch, max_wait_s
        self.max_batch_tokens, self.max_queue = max_batch_tokens, max_queue
        self.queue, self.passes, self.requests = _Pending(), 0, 0
        self.pending = self.dropped = self.gone = self.expired = self.refused = self.largest_tokens = 0
        self.generations_stopped = self.sliced = 0  # Ray Serve runs a request whole: never sliced
        self.busy, self.pass_s, self.tokens_per_s = False, 0.0, 0.0
        self._count = threading.Lock()

    def submit(self, texts: list[str], tasks: list[str], tokens: int, text_pairs: list[str] | None = None,
               per_text: list[int] | None = None, client: str = "") -> Job:
        """As MicroBatcher.submit; Ray Serve's own batching runs a request whole, in arrival order (per_text, for
        slicing, and client, for a fair share, are unused)."""
        with self._count:
            if self.pending >= self.max_queue:
                self.refused += 1
                raise Busy()
            self.pending += 1
        self.largest_tokens = max(self.largest_tokens, tokens)
        future = asyncio.ensure_future(self._answer(texts, tasks, text_pairs))
        self.queue.n += 1
        future.add_done_callback(self._settled)
        return Job(texts, tasks, tokens, future, text_pairs)

    def _settled(self, future) -> None:
        with self._count:
            self.pending -= 1
        self.queue.n -= 1
        if future.cancelled():
            self.dropped += 1
        elif future.exception() is None:
            self.requests += 1

    async def _answer(self, texts, tasks, text_pairs) -> list[dict]:
        ok, answer = await self.batched((texts, tasks, text_pairs))
        if not ok:
            raise answer
        return answer

    def bind(self) -> None:  # no queue of its own: Ray Serve does the batching
        return None

    async def run(self) -> None:  # the app's lifespan starts it; Ray Serve does the batching
        return None

    def counted_pass(self, side, part: list[tuple]) -> list[list[dict]]:
        """predict_group over `part`, counted as a pass."""
        answers = predict_group(side, part)
        self.passes += 1
        return answers


@serve.ingress()
class SideTasksIngress:
    """One replica: SideTasks + the app. Constructed by Ray Serve with (base, heads, ServeConfig as a dict, the
    runtime's name)."""

    def __init__(self, base: str, heads: list[str], cfg: dict, runtime: str = "torch"):
        import torch

        from adalayers.infer.sidetasks import SideTasks

        self.cfg = ServeConfig(**cfg)
        if self.cfg.num_threads:
            torch.set_num_threads(self.cfg.num_threads)
        # --threads also sizes the replica's llama.cpp / ONNX Runtime engine (unset: llama.cpp's takes
        # OMP_NUM_THREADS, which Ray sets to the replica's CPUs, at least 1; ONNX Runtime's every core)
        self.side = SideTasks.load(base, heads, primary=self.cfg.primary, device=self.cfg.device,
                                   max_length=self.cfg.max_length, batch_size=self.cfg.max_batch, runtime=runtime,
                                   threads=self.cfg.num_threads)
        self.predict_many.set_max_batch_size(self.cfg.max_batch)
        self.predict_many.set_batch_wait_timeout_s(self.cfg.max_wait_ms / 1000)
        self.batcher = ServeBatcher(self.predict_many, self.cfg.max_batch, self.cfg.max_wait_ms / 1000,
                                    max(1, self.cfg.max_batch_tokens), max(1, self.cfg.max_queue))

    def __serve_build_asgi_app__(self):
        from adalayers.serve.app import create_app
        from adalayers.serve.auth import read_api_key
        from adalayers.serve.memory import freeze_loaded

        app = create_app(self.side, self.cfg, read_api_key(self.cfg.api_key_file), batcher=self.batcher)
        freeze_loaded()  # as the uvicorn server does once loaded (serve/memory.py)
        return app

    @serve.batch(max_batch_size=32, batch_wait_timeout_s=0.005)
    async def predict_many(self, group: list[tuple]) -> list[tuple[bool, object]]:
        """A batch of requests (texts, tasks, text_pairs): single texts and sentence pairs, one predict call
        each; per request (True, its results) or (False, the exception it alone raised)."""
        answers: list = [None] * len(group)
        for pairs in (False, True):
            idx = [i for i, job in enumerate(group) if (job[2] is not None) == pairs]
            if idx:
                for i, answer in zip(idx, await asyncio.to_thread(self._predict_part, [group[i] for i in idx])):
                    answers[i] = answer
        return answers

    def _predict_part(self, part: list[tuple]) -> list[tuple[bool, object]]:
        """predict_group over `part`; when it fails, every request alone (only the faulty one gets the error)."""
        b = self.batcher
        t0, b.busy = time.perf_counter(), True
        try:
            answers = each_alone(lambda jobs: b.counted_pass(self.side, jobs), part)
        finally:
            b.busy = False
        dt = time.perf_counter() - t0
        b.pass_s = 0.8 * b.pass_s + 0.2 * dt if b.pass_s else dt
        return answers

    def check_health(self) -> None:
        """Ray Serve's health probe: the model answers."""
        self.side.check_tasks(None)


def application(base: str, heads: list[str], cfg: ServeConfig, replicas: int = 1,
                min_replicas: int | None = None, max_replicas: int | None = None, runtime: str = "torch",
                backend: str | None = None):
    """The bound deployment: `replicas` fixed, or autoscaling between min_replicas and max_replicas.
    `backend`: runtime's deprecated old name."""
    runtime = runtimes.deprecated_backend(runtime, backend)
    if min_replicas is not None or max_replicas is not None:
        lo, hi = min_replicas or 1, max_replicas or max(min_replicas or 1, replicas)
        scale = {"autoscaling_config": {"min_replicas": lo, "max_replicas": hi,
                                        "target_ongoing_requests": max(1, cfg.max_batch // 2)}}
    else:
        scale = {"num_replicas": replicas}
    # half a logical CPU each: a local Ray of 2 CPUs holds up to 4 replicas (CPU threads: --threads)
    deployment = serve.deployment(SideTasksIngress, name="adalayers", ray_actor_options={"num_cpus": 0.5},
                                  max_ongoing_requests=max(100, 4 * cfg.max_batch), graceful_shutdown_timeout_s=30,
                                  health_check_period_s=10, **scale)
    return deployment.bind(base, [str(h) for h in heads], cfg.model_dump(), runtimes.get(runtime).name)


def start(base: str, heads: list[str], cfg: ServeConfig, replicas: int = 1, min_replicas: int | None = None,
          max_replicas: int | None = None, address: str | None = None, num_cpus: int | None = None,
          runtime: str = "torch", backend: str | None = None) -> str:
    """Start (or join) Ray, put Serve's HTTP proxy on cfg.host:cfg.port, deploy; returns the URL. `backend`:
    runtime's deprecated old name."""
    runtime = runtimes.deprecated_backend(runtime, backend)
    from adalayers.raylocal import init_ray

    init_ray(address, num_cpus or 2)
    serve.start(http_options={"host": cfg.host, "port": cfg.port})
    serve.run(application(base, heads, cfg, replicas, min_replicas, max_replicas, runtime), name="adalayers",
              route_prefix="/", blocking=False)
    return f"http://{cfg.host}:{cfg.port}"


def stop() -> None:
    """Graceful: Serve drains its replicas, then the Ray this process started goes down."""
    import ray

    serve.shutdown()
    ray.shutdown()
