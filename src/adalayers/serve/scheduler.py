"""Continuous batching of generation: one scheduler thread owns the decode loop of the service.

    scheduler = Scheduler(side)
    events = scheduler.stream(prompts, GenerationParams(max_new_tokens=32, tasks=(...), ...))   # infer/generate
    # .start's arguments and events: "prompt" (after the prefill), one "step" per token, then "done"

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

Room. At most max_rows rows decode together. A runtime with a fixed context (llama.cpp: one context of
n_seq sequences and n_ctx KV tokens, shared with /predict's passes) gives the room generations may hold,
runtime.generation_room(max_length) = (rows, tokens): a request is admitted only while the running rows
and it fit, each row counted at its most (its prompt's tokens + max_new_tokens), so the passes' share stays
free. A request that does not fit now waits at the head of the queue (requests behind it wait too: first
come, first served) until rows leave; one that can never fit is refused before it is queued (DataError).

Prefill in chunks. A runtime whose prefill takes a bounded number of prompt tokens (llama.cpp: runtime.prefill_tokens())
refuses a request whose own prompts exceed it before it is queued. Between two decode steps the scheduler prefills
at most `prefill_chunk` prompt tokens (serve's --batch-size, llama-server's logical batch; 2048): the waiting
requests in groups up to it (a request larger than it alone), so a burst of prompts neither overflows the batch nor
holds the running rows for all its prompts at once. A prefill that runs in pieces (the torch-free llama.cpp path
cuts it into llama_decodes of n_batch tokens) steps the running rows once a chunk of it is done: a long prompt stalls
the generations already decoding for one chunk at a time, not for its whole prefill. A smaller chunk: shorter
stalls of the running rows and earlier first tokens in a burst, more steps taken in between.
"""
from __future__ import annotations

import logging
import queue
import threading
from typing import Callable

from adalayers.errors import Cancelled, DataError
from adalayers.infer.generate import Generation
from adalayers.infer.params import GenerationParams
from adalayers.infer.request import Job, Row, Stream, job_events

log = logging.getLogger(__name__)

__all__ = ["Scheduler", "Job", "Stream"]


class Scheduler:
    @staticmethod
    def supports(side) -> bool:
        """A decoder whose runtime merges and splits KV caches between steps (transformers' DynamicCache,
        llama.cpp's sequences); other runtimes generate per request through infer/generate.stream."""
        return bool(side.backbone.is_causal) and side.runtime.continuous_batching

    def __init__(self, side, max_rows: int = 64, prefill_chunk: int | None = None):
        self.side, self.max_rows = side, max_rows
        self.room = side.runtime.generation_room(side.max_length)  # (rows, KV tokens) or None
        if self.room is not None:
            self.max_rows = min(max_rows, self.room[0])
        self.prefill_limit = side.runtime.prefill_tokens()  # prompt tokens of one prefill at most, or None
        # prompt tokens prefilled between two decode steps of the running rows (None: as many as one prefill takes)
        self.prefill_chunk = min([n for n in (prefill_chunk, self.prefill_limit) if n is not None], default=None)
        self.loop = Generation(side)
        self.waiting: queue.Queue = queue.Queue()
        self._next: tuple[Job, int] | None = None  # taken from the queue, waiting for room
        self._admitting: list[Job] = []  # taken from the queue, being prefilled
        self._thread, self._start = None, threading.Lock()
        self.steps = self.rows_stepped = self.largest_step = 0

    def stats(self) -> dict:
        """Decode steps run, rows they decoded (together), the most rows in one step, requests waiting."""
        return {"decode_steps": self.steps, "rows_decoded": self.rows_stepped, "largest_step_rows": self.largest_step,
                "generations_waiting": self.waiting.qsize() + (self._next is not None)}

    def stream(self, prompts: list[str], params: GenerationParams | None = None, **kw) -> Stream:
        """infer/generate.start's events for this request (params, or infer/generate.stream's keywords), decoded
        together with every other running one. A bad request, or one that can never fit the room, raises here
        (DataError, ModelError), before it is queued."""
        job = Job(self.side, prompts, params or GenerationParams.of(**kw))
        need, prompt = self._tokens(job)
        if self.room is not None and (len(job.prompts) > self.room[0] or need > self.room[1]):
            raise DataError(f"the request needs {len(job.prompts)} sequence(s) and {need} KV tokens (prompt tokens + "
                            f"max_new_tokens per prompt); generations on this runtime hold at most {self.room[0]} "
                            f"sequences and {self.room[1]} KV tokens (the context less /predict's share)")
        if self.prefill_limit is not None and prompt > self.prefill_limit:
            raise DataError(f"the request's prompts have {prompt} tokens; one prefill on this runtime takes at most "
                            f"{self.prefill_limit}")
        with self._start:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="adalayers-scheduler", daemon=True)
                self._thread.start()
        self.waiting.put((job, need, prompt))
        return Stream(job_events(job), job)

    def _tokens(self, job: Job) -> tuple[int, int]:
        """(the KV tokens the job's rows hold at most: each prompt's tokens (as the prefill cuts them) + max_new,
        its prompt tokens); (0, 0) on a runtime with neither a fixed room nor a prefill limit."""
        if self.room is None and self.prefill_limit is None:
            return 0, 0
        ids = self.side.backbone.tokenizer(job.wrapped, truncation=True, max_length=self.side.max_length)["input_ids"]
        prompt = sum(len(i) for i in ids)
        return prompt + job.max_new * len(ids), prompt

    def _fits(self, rows: int, tokens: int) -> bool:
        return rows <= self.max_rows and (self.room is None or tokens <= self.room[1])

    # --- the loop ---------------------------------------------------------------------------
    def _loop(self) -> None:
        batch = None
        while True:
            try:
                batch = self._admit(batch)
            except Exception as e:  # noqa: BLE001  (the scheduler's own fault: the requests it held get it)
                log.error("admitting generations failed: %s", e, exc_info=e)
                held = [r.owner for r in batch.rows] if batch is not None else []
                for job in {id(j): j for j in held + self._admitting}.values():
                    job.events.put(e)
                batch, self._admitting = None, []
                continue  # the thread goes on: later requests are served
            if batch is not None:
                batch = self._safe_step(batch)

    def _safe_step(self, batch):
        """One decode step of the running rows; a failing step fails the requests it held, not the server."""
        try:
            return self._step(batch)
        except Exception as e:  # noqa: BLE001
            log.error("a decode step failed: %s", e, exc_info=e)
            for job in {id(r.owner): r.owner for r in batch.rows}.values():
                job.events.put(e)
            return None

    def _step(self, batch):
        self.steps, self.rows_stepped = self.steps + 1, self.rows_stepped + len(batch.rows)
        self.largest_step = max(self.largest_step, len(batch.rows))
        return self.loop.step(batch)

    def _admit(self, batch):
        """Waiting requests that fit (in order, up to a chunk of prompt tokens) prefilled together and merged in,
        blocking while nothing runs; rows of requests whose consumer left are dropped."""
        batch = _live(batch)
        jobs, rows = [], batch.rows if batch is not None else []
        held, tokens, prompts = len(rows), sum(_held(r) for r in rows), 0
        while True:
            if self._next is None:
                try:
                    self._next = self.waiting.get(block=batch is None and not jobs)
                except queue.Empty:
                    break
            job, need, prompt = self._next
            if not job.cancelled.is_set():
                if (batch is not None or jobs) and not self._fits(held + len(job.prompts), tokens + need):
                    break  # waits (at the head of the queue) until rows leave
                if jobs and self.prefill_chunk is not None and prompts + prompt > self.prefill_chunk:
                    break  # the next group's: prefilled after the next decode step
                jobs.append(job)
                held, tokens, prompts = held + len(job.prompts), tokens + need, prompts + prompt
            self._next = None
        running, self._admitting = Running(batch, self._safe_step, self.prefill_chunk), jobs
        for new in self._prefilled(jobs, running.between):
            running.batch = new if running.batch is None else running.batch.merge(new)
        self._admitting = []
        return running.batch

    def _prefilled(self, jobs: list[Job], between: Callable[[int], None]) -> list:
        """The jobs' prompts in one prefill; when that fails, each job alone, so only a faulty one fails."""
        if not jobs:
            return []
        try:
            # None: every prompt tripped a guard
            return [b for b in [self.loop.prefill(jobs, between)] if b is not None]
        except Exception as e:  # noqa: BLE001
            if len(jobs) == 1:
                # a prefill nobody waits for: its traceback would hold the pass's tensors as long as the job lives
                jobs[0].events.put(e.with_traceback(None) if isinstance(e, Cancelled) else e)
                return []
        return [b for job in jobs for b in self._prefilled([job], between)]


class Running:
    """The rows generating while a prefill runs: between two of its pieces (Generation.prefill's `between`) they
    take one decode step (`step`) once `chunk` prompt tokens have been prefilled since their last."""

    def __init__(self, batch, step: Callable[[object], object], chunk: int | None):
        self.batch, self.step, self.chunk, self.prefilled = batch, step, chunk, 0

    def between(self, tokens: int) -> None:
        self.prefilled += tokens
        if self.batch is not None and self.chunk is not None and self.prefilled >= self.chunk:
            self.batch = _live(self.batch)
            self.batch, self.prefilled = self.step(self.batch) if self.batch is not None else None, 0


def _live(batch):
    """The batch without the rows of requests whose consumer left (None: no row is left)."""
    if batch is None or not any(r.owner.cancelled.is_set() for r in batch.rows):
        return batch
    batch = batch.keep([i for i, r in enumerate(batch.rows) if not r.owner.cancelled.is_set()])
    return batch if batch.rows else None


def _held(row: Row) -> int:
    """The KV tokens a running row holds at most: its prompt's and its max_new_tokens."""
    return len(row.prompt_ids) + row.owner.max_new
