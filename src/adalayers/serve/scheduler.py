"""Continuous batching of generation: one scheduler thread owns the decode loop of the service.

    scheduler = Scheduler(side)
    events = scheduler.stream(prompts, max_new_tokens=32, tasks=[...], ...)   # infer/generate.stream's
    # arguments and events: "prompt" (after the prefill), one "step" per token, then "done"

A new request waits in a queue. Between two decode steps the scheduler prefills every waiting request
(all their prompts as one left-padded batch, the heads' hooks on: one forward) and merges their rows into
the running batch (infer/batching.Batch: rows line up on the right, per-row positions, masks, accumulators
and KV cache); then one decode step runs for all rows of all requests together. Prefill and step are
infer/generate.Generation's, the loop a single generate() call runs too: this module only queues. A row leaves as soon as it ends
(end of text, max tokens, stop string, guard) and a request gets its "done" event when its last row
has left. Every loaded head accumulates on every row (one pass feeds them all); each request reads
the heads it asked for. Sampling runs per request with its own generator, so a seed gives the same
text whatever else runs beside it. A request whose consumer stops reading (client gone) leaves at the
next step; a request whose prefill fails gets the error alone.
"""
from __future__ import annotations

import logging
import queue
import sys
import threading
from typing import Iterator

from adalayers.infer.batching import Batch
from adalayers.infer.generate import Generation, Job
from adalayers.infer.torch_runtime import as_runtime

log = logging.getLogger(__name__)

__all__ = ["Scheduler", "Job"]


class Scheduler:
    @staticmethod
    def supports(backbone) -> bool:
        """A decoder whose runtime merges and splits KV caches between steps (transformers' DynamicCache);
        other runtimes (llama.cpp) generate per request through infer/generate.stream."""
        return bool(backbone.is_causal) and as_runtime(backbone).continuous_batching

    def __init__(self, side, max_rows: int = 64):
        self.side, self.max_rows = side, max_rows
        self.loop = Generation(side)
        self.waiting: queue.Queue = queue.Queue()
        self._thread, self._start = None, threading.Lock()

    def stream(self, prompts: list[str], **kw) -> Iterator[dict]:
        """infer/generate.stream's events for this request, decoded together with every other running one.
        A bad request raises here (DataError, ModelError), before it is queued."""
        job = Job(self.side, prompts, **kw)
        with self._start:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="adalayers-scheduler", daemon=True)
                self._thread.start()
        self.waiting.put(job)
        return _events(job)

    # --- the loop ---------------------------------------------------------------------------
    def _loop(self) -> None:
        batch = None
        while True:
            batch = self._admit(batch)
            if batch is None:
                continue
            try:
                batch = self._step(batch)
            except Exception as e:  # noqa: BLE001  (a failing step fails the requests it held, not the server)
                log.error("a decode step failed: %s", e, exc_info=e)
                for job in {id(r.owner): r.owner for r in batch.rows}.values():
                    job.events.put(e)
                batch = None

    def _step(self, batch: Batch) -> Batch | None:
        return self.loop.step(batch)

    def _admit(self, batch: Batch | None) -> Batch | None:
        """Waiting requests prefilled together (one forward) and merged in, blocking while nothing runs;
        rows of requests whose consumer left are dropped."""
        if batch is not None and any(r.owner.cancelled.is_set() for r in batch.rows):
            batch = batch.keep([i for i, r in enumerate(batch.rows) if not r.owner.cancelled.is_set()])
            batch = batch if batch.rows else None
        jobs, rows = [], len(batch.rows) if batch is not None else 0
        while rows < self.max_rows:
            try:
                job = self.waiting.get(block=batch is None and not jobs)
            except queue.Empty:
                break
            if not job.cancelled.is_set():
                jobs.append(job)
                rows += len(job.prompts)
        for new in self._prefilled(jobs):
            batch = new if batch is None else batch.merge(new)
        return batch

    def _prefilled(self, jobs: list[Job]) -> list[Batch]:
        """The jobs' prompts in one prefill; when that fails, each job alone, so only a faulty one fails."""
        if not jobs:
            return []
        try:
            return [self.loop.prefill(jobs)]
        except Exception:  # noqa: BLE001
            if len(jobs) == 1:
                jobs[0].events.put(sys.exc_info()[1])
                return []
        return [b for job in jobs for b in self._prefilled([job])]


def _events(job: Job) -> Iterator[dict]:
    try:
        while True:
            event = job.events.get()
            if isinstance(event, BaseException):
                raise event
            yield event
            if event["event"] == "done":
                return
    finally:
        job.cancelled.set()  # the consumer stopped (or finished): its rows leave at the next step
