"""The queue of /predict-like work: concurrent requests gathered into batches, one base pass each.

Requests wait in a bounded asyncio queue (full: Busy, answered 503 with Retry-After); one worker takes
the first, gathers whatever else arrives within max_wait_ms (up to max_batch texts and max_batch_tokens
tokens), and runs them as one base pass in a thread (predict_group), so the event loop keeps accepting
requests while the model runs. One request never fails another: each is validated alone before it is
queued (serve/state.py), and when a batch still fails its requests are rerun one by one (batching.each_alone),
so only the faulty one gets the error. A request whose client has disconnected (before it is queued, or while it
waits), or whose deadline (request_timeout_s) has passed, is dropped unrun.

A request whose tokens would take the base longer than slice_s (at the tokens/s of the passes so far, a
running mean) runs in slices of whole texts of about that much work (a longer text alone): the first slice
at once, each later one queued when the one before is answered. The queue serves requests of at most one slice
of work, then the first slices of larger ones, then the later slices of running ones; so a short request waits
for the one slice that is running, not for the large requests that came before it (they take the time no short
request asks for, within their deadline). Within each of these turns clients share the base fairly (start-time
fair queueing, Goyal et al. 1996, a request's cost its tokens): a client's request is tagged with the virtual time
at which that client's earlier requests would be done, and the smallest tag goes first, so one client's burst of
concurrent requests takes turns with another client's one request instead of all going first (issue 56). A client
is the X-Client-Id header when the request has one (a tenant as a gateway names it), else its address
(serve/state.client_of). A group (one pass) holds jobs of one
of these three kinds and at most one slice of work (or its first job, when that is more), so a short request
never rides along a heavy pass it cannot stop (a pass stops early only when every client in it has left). The
request's answer is its slices' answers in order; a slice that fails fails the request.

Ray Serve (serve/ray_serve.py) has a batcher of its own; both are serve/batching.Batcher (submit -> Job, admit,
retry_after_s, run, queue, the counters /health reads) and answer through the same predict_group.
"""
from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import threading
import time
from dataclasses import dataclass, field

from adalayers.data.windows import consecutive
from adalayers.errors import Cancelled
from adalayers.infer.predictor_base import PredictorBase
from adalayers.serve.batching import Admits, Busy, Job, each_alone, heavy_full, predict_group
from adalayers.serve.lanes import Lane

__all__ = ["MicroBatcher", "Busy", "Job", "predict_group"]

log = logging.getLogger(__name__)


@dataclass
class MicroBatcher(Admits):
    """The Batcher (serve/batching.py) of the uvicorn server: gathers concurrent requests into batches of at
    most max_batch texts and max_batch_tokens tokens and runs them in a thread; at most max_queue requests wait."""
    side: PredictorBase
    max_batch: int
    max_wait_s: float
    max_batch_tokens: int = 16_384
    max_queue: int = 64
    slice_s: float = 0.5
    queue: asyncio.Queue = None
    passes: int = 0      # groups run (each is one predict call: one base pass per max_batch texts)
    requests: int = 0
    dropped: int = 0     # requests dropped unrun: their client left or their deadline passed
    gone: int = 0        # requests whose client disconnected before the answer
    expired: int = 0     # requests answered 503 at their deadline
    busy: bool = False   # a group is running
    largest_tokens: int = 0  # the most tokens one group has held
    refused: int = 0     # requests answered 503 because the queue was full
    pass_s: float = 0.0  # running mean of a group's seconds (for Retry-After)
    tokens_per_s: float = 0.0  # running mean of the base's tokens per second over the groups run (for slices)
    pending: int = 0     # requests queued or running whose answer is still awaited
    heavy_pending: int = 0  # ... of them, those of more than one slice of work (at most half of max_queue)
    generations_stopped: int = 0  # /generate runs stopped at a decode step: client gone or deadline passed
    sliced: int = 0      # requests run in slices (more work than slice_s)
    _count: threading.Lock = field(default_factory=threading.Lock, repr=False)  # `pending` changes from threads too
    lane: Lane = field(default_factory=lambda: Lane("adalayers-pass"), repr=False)  # the passes' own thread

    def __post_init__(self):
        self.bind()

    def bind(self) -> None:
        """A new (empty) queue on the running event loop, of (turn, tag, arrival, job): turn 0 a request of at most
        one slice of work, 1 a larger one (its first slice), 2 the later slices of a running one; tag its start tag
        in its client's fair share (_tagged)."""
        self.queue, self._arrival = asyncio.PriorityQueue(), itertools.count()
        self._virtual, self._finish = 0.0, {}  # the tag of the job last taken; each client's last finish tag

    def _slice_tokens(self) -> int:
        """The tokens of one slice of work at the base's measured speed (0 before the first pass)."""
        return max(1, int(self.tokens_per_s * self.slice_s)) if self.tokens_per_s else 0

    def _put(self, job: Job, later: bool = False) -> None:
        limit = self._slice_tokens()
        turn = 2 if later else int(bool(limit) and job.tokens > limit)
        self.queue.put_nowait((turn, self._tagged(job), next(self._arrival), job))

    def _tagged(self, job: Job) -> float:
        """Start-time fair queueing: the job's start tag is the later of the virtual time (the tag of the job last
        taken) and the finish tag of its client's previous job; the client's finish tag moves on by the job's
        tokens. A client with nothing queued starts at the virtual time: it neither saved up turns nor owes any.
        A later slice starts at the virtual time: its request was charged whole when it came."""
        if job.slice_of is not None:
            return self._virtual
        start = max(self._virtual, self._finish.get(job.client, 0.0))
        self._finish[job.client] = start + max(1, job.tokens)
        return start

    def _taken(self, tag: float) -> None:
        """The virtual time moves to the tag of the job taken; clients whose work is all before it are forgotten
        (their next job starts at the virtual time anyway), so the table holds at most the clients with work queued."""
        self._virtual = max(self._virtual, tag)
        if len(self._finish) > 2 * self.max_queue:
            self._finish = {c: f for c, f in self._finish.items() if f > self._virtual}

    def submit(self, texts: list[str], tasks: list[str], tokens: int, text_pairs: list[str] | None = None,
               per_text: list[int] | None = None, client: str = "") -> Job:
        """Queue a job (its future holds the results), or raise Busy when max_queue requests are pending, or when
        it is a request of more than one slice of work and half of max_queue such requests are (a flood of heavy
        requests, such as a cancel storm's, leaves room for small ones).
        A request whose client left or whose deadline passed stops counting at once (its future is
        cancelled), though the worker only discards it when it reaches it."""
        limit = self._slice_tokens()
        heavy = bool(limit) and tokens > limit  # more than one slice of work
        if self.pending >= self.max_queue or (heavy and heavy_full(self.heavy_pending, self.max_queue)):
            self.refused += 1
            raise Busy()
        job = Job(texts, tasks, tokens, asyncio.get_running_loop().create_future(), text_pairs, per_text,
                  client=client)
        with self._count:
            self.pending += 1
            self.heavy_pending += heavy
        job.future.add_done_callback(functools.partial(self._settled, heavy))
        self._put(job)
        return job

    def _settled(self, heavy: bool, _future) -> None:
        with self._count:
            self.pending -= 1
            self.heavy_pending -= heavy

    async def _next(self) -> tuple[int, Job]:
        """The next job with its turn (see bind), skipping jobs nobody waits for any more."""
        while True:
            turn, tag, _, job = await self.queue.get()
            self._taken(tag)
            job = self._sliced(job)
            if not job.future.done():
                return turn, job
            self._drop(job)

    def _drop(self, job: Job) -> None:
        if job.slice_of is None:  # a request's later slices are dropped with it, counted once
            self.dropped += 1

    def _sliced(self, job: Job) -> Job:
        """A request of more work than slice_s: its first slice (each next one is queued when the one before is
        answered); else the job. Nothing is sliced before a pass has measured the base's tokens/s."""
        limit = self._slice_tokens()
        if not limit or job.tokens <= limit or job.per_text is None or len(job.texts) < 2 \
                or job.future.done():
            return job
        parts = consecutive(job.per_text, limit)
        if len(parts) < 2:
            return job
        loop = asyncio.get_running_loop()
        jobs = [Job(job.texts[a:b], job.tasks, sum(job.per_text[a:b]), loop.create_future(),
                    None if job.text_pairs is None else job.text_pairs[a:b], job.per_text[a:b], job, job.client)
                for a, b in parts]
        answers: list = [None] * len(jobs)

        def settled(k: int, future: asyncio.Future) -> None:
            if job.future.done() or future.cancelled():
                return
            if future.exception() is not None:
                job.future.set_exception(future.exception())
                return
            answers[k] = future.result()
            if k + 1 < len(jobs):  # the next slice queues now, after any new request
                self._put(jobs[k + 1], later=True)
            else:
                job.future.set_result([r for a in answers for r in a])
                self.requests += 1

        for k, part in enumerate(jobs):
            part.future.add_done_callback(lambda f, k=k: settled(k, f))
        job.future.add_done_callback(lambda _: [p.future.cancel() for p in jobs])  # the client left: slices go too
        self.sliced += 1
        return jobs[0]

    async def run(self) -> None:
        loop, carry = asyncio.get_running_loop(), None
        while True:
            turn, first = carry or await self._next()
            group, carry, n, tokens = [first], None, len(first.texts), first.tokens
            limit = self._slice_tokens()  # a group: one slice of work at most, or its first job
            budget = min(self.max_batch_tokens, max(limit, tokens)) if limit else self.max_batch_tokens
            deadline = loop.time() + self.max_wait_s
            while n < self.max_batch and tokens < budget:
                try:
                    left = deadline - loop.time()
                    kind, tag, _, job = self.queue.get_nowait() if left <= 0 else \
                        await asyncio.wait_for(self.queue.get(), left)
                except (asyncio.QueueEmpty, asyncio.TimeoutError):
                    break
                self._taken(tag)
                job = self._sliced(job)
                if job.future.done():
                    self._drop(job)
                    continue
                if kind != turn or n + len(job.texts) > self.max_batch or tokens + job.tokens > budget:
                    carry = (kind, job)  # starts the next group
                    break
                group.append(job)
                n, tokens = n + len(job.texts), tokens + job.tokens
            await self._run_group(group)

    def _pass(self, jobs: list[Job]) -> list[list[dict]]:
        """One predict_group call for `jobs` (one answer per job), in a worker thread; the pass's time feeds
        Retry-After and the slices' size."""
        self.largest_tokens = max(self.largest_tokens, sum(job.tokens for job in jobs))
        t0, self.busy = time.perf_counter(), True
        try:
            answers = predict_group(self.side, [(job.texts, job.tasks, job.text_pairs) for job in jobs],
                                    lambda: [job.future.done() for job in jobs])
        finally:
            self.busy = False
        self.passes += 1
        seconds = time.perf_counter() - t0
        self.pass_s = 0.8 * self.pass_s + 0.2 * seconds if self.pass_s else seconds
        rate = sum(job.tokens for job in jobs) / max(seconds, 1e-6)
        self.tokens_per_s = 0.8 * self.tokens_per_s + 0.2 * rate if self.tokens_per_s else rate
        return answers

    async def _run_group(self, group: list[Job]) -> None:
        """Single texts and sentence pairs of one group go to the base as two predict calls."""
        for pairs in (False, True):
            part = [job for job in group if (job.text_pairs is not None) == pairs]
            if part:
                await self._run_part(part)

    async def _run_part(self, group: list[Job]) -> None:
        live = [job for job in group if not job.future.done()]
        for job in group:
            if job.future.done():
                self._drop(job)
        if not live:
            return
        try:  # a failing group: each request alone (each_alone), so only the faulty one gets the error
            answers = await self.lane.run(each_alone, self._pass, live, lambda job: job.future.done())
        except Cancelled:  # every client left or every deadline passed during the pass: stopped between batches
            answers = [None] * len(live)
        for job, answer in zip(live, answers):
            if answer is None:
                self._drop(job)
            elif answer[0]:
                self._deliver([job], [answer[1]])
            elif not job.future.done():
                job.future.set_exception(answer[1])

    def _deliver(self, jobs: list[Job], answers: list[list[dict]]) -> None:
        for job, mine in zip(jobs, answers):
            if not job.future.done():
                job.future.set_result(mine)
                self.requests += job.slice_of is None  # a sliced request counts once, when whole
