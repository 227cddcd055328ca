"""What every batcher of the service is (the Batcher protocol), and what both batchers share: the queued
request (Job), the full-queue signal (Busy), admission under --max-queue (Admits), one pass over a group of
requests (predict_group) and the rule for a failing group (each_alone: rerun every request alone).

    serve/batcher.py      MicroBatcher: an asyncio queue gathered into passes (uvicorn)
    serve/ray_serve.py    ServeBatcher: Ray Serve's @serve.batch

The routers and ServeState read a batcher only through this protocol: no route asks what a batcher has.
"""
from __future__ import annotations

import asyncio
import logging
import math
import threading
from dataclasses import dataclass
from typing import Callable, Protocol, TypeVar

from adalayers.errors import Cancelled, DataError
from adalayers.infer.predictor_base import PredictorBase
from adalayers.kinds import TaskKind

log = logging.getLogger(__name__)
T = TypeVar("T")
R = TypeVar("R")


class Busy(Exception):
    """The queue is full."""


def heavy_full(heavy_waiting: int, capacity: int) -> bool:
    """Large requests may hold at most half of a queue's places (at least one), so that a flood of them (a cancel
    storm's) leaves room for small ones: the rule of the batcher's queue and of the checks' lane."""
    return heavy_waiting >= max(1, capacity // 2)


@dataclass
class Job:
    """One queued request: its texts (and second texts), the heads it asks for, the tokens it was
    charged, and the future its answer (one result per text) is set on."""
    texts: list[str]
    tasks: list[str]
    tokens: int
    future: asyncio.Future
    text_pairs: list[str] | None = None
    per_text: list[int] | None = None  # the tokens of each text (how a large request is sliced)
    slice_of: "Job | None" = None      # the request this job is a slice of (its answers are assembled there)
    client: str = ""                   # who sent it (serve/state.client_of): the batcher's fair share


class Waiting(Protocol):
    def qsize(self) -> int: ...


class Batcher(Protocol):
    """The queue of /predict-like work and the count of everything pending under --max-queue."""
    max_batch: int
    max_wait_s: float
    max_batch_tokens: int
    max_queue: int
    queue: Waiting
    # counters (GET /health)
    passes: int               # groups run
    requests: int             # requests answered
    dropped: int              # requests dropped unrun: their client left or their deadline passed
    gone: int                 # requests whose client disconnected before the answer
    expired: int              # requests answered 503 at their deadline
    refused: int              # requests answered 503 because the queue was full
    pending: int              # requests queued or running (generations too) whose answer is still awaited
    busy: bool                # a group is running
    largest_tokens: int       # the most tokens one group has held
    generations_stopped: int  # generations stopped at a decode step: client gone or deadline passed
    sliced: int               # requests run in slices
    tokens_per_s: float       # the base's measured speed

    def submit(self, texts: list[str], tasks: list[str], tokens: int, text_pairs: list[str] | None = None,
               per_text: list[int] | None = None, client: str = "") -> Job:
        """Queue a request (its future holds the results), or raise Busy when max_queue are pending."""

    def admit(self) -> Callable[[], None] | None:
        """Count work that does not go through the queue (a generation) as pending: the function that ends
        its count (safe to call twice, from any thread), or None when max_queue requests are pending."""

    def retry_after_s(self) -> int:
        """The seconds a refused client should wait (Retry-After)."""

    def bind(self) -> None:
        """Attach to the server's running event loop (before run)."""

    async def run(self) -> None:
        """The worker, run while the server runs."""


class Admits:
    """admit() and retry_after_s() for a batcher with `pending`, `refused`, `max_queue`, `pass_s` and a
    lock `_count` (pending changes from threads: a stream ends in Starlette's worker thread)."""
    pending: int
    refused: int
    max_queue: int
    pass_s: float
    _count: threading.Lock

    def admit(self) -> Callable[[], None] | None:
        with self._count:
            if self.pending >= self.max_queue:
                self.refused += 1
                return None
            self.pending += 1
        ended = []

        def release() -> None:  # at most once
            with self._count:
                if not ended:
                    ended.append(True)
                    self.pending -= 1
        return release

    def retry_after_s(self) -> int:
        return max(1, math.ceil(self.pass_s * (self.pending + 1)))


def each_alone(run: Callable[[list[T]], list[R]], jobs: list[T],
               skip: Callable[[T], bool] = lambda job: False) -> list[tuple[bool, R | Exception] | None]:
    """`run` over the jobs as one group; when the group fails, every job alone, so that only a faulty one gets
    the error. Per job: (True, its answer), (False, its error), or None (skipped: skip(job) before its rerun,
    or Cancelled alone). Cancelled of the whole group is raised: nobody waits for any of them."""
    try:
        return [(True, a) for a in run(jobs)]
    except Cancelled:
        raise
    except Exception as e:  # noqa: BLE001
        if len(jobs) == 1:
            return [_failed(e)]
        log.warning("a batch of %d requests failed (%s); running them one at a time", len(jobs), e)
    out: list = []
    for job in jobs:
        if skip(job):
            out.append(None)
            continue
        try:
            out.append((True, run([job])[0]))
        except Cancelled:
            out.append(None)
        except Exception as e1:  # noqa: BLE001
            out.append(_failed(e1))
    return out


def _failed(e: Exception) -> tuple[bool, Exception]:
    if not isinstance(e, DataError):
        log.error("a request failed on the server side: %s", e, exc_info=e)
    return False, e


def predict_group(side: PredictorBase, group: list[tuple[list[str], list[str], list[str] | None]],
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
