"""One generation request (a Job): its prompts and GenerationParams checked, its events queued ("prompt", one
"step" per token, "done"), and the Stream one consumer reads them from. infer/generate.Generation fills the
queue, for one request at a time (infer/generate.stream) or for many (serve/scheduler.py).
"""
from __future__ import annotations

import queue
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterator

from adalayers.errors import Cancelled, DataError
from adalayers.infer.answers import AnswerText
from adalayers.infer.guarding import guard_rules
from adalayers.infer.params import GenerationParams
from adalayers.infer.sampling import generator
from adalayers.kinds import TaskKind


def check_request(side, prompts: list[str], params: GenerationParams) -> tuple[list[str], dict, set]:
    """A generation request checked (DataError/ModelError naming the problem): (the heads to answer,
    the guard {head: [(label, threshold), ...]} (infer/guarding.py), the end-of-text token ids; none with ignore_eos).
    max_new_tokens is at least 1 here; the service bounds it by its context (serve/params.py)."""
    decoder = side.runtime.decoder()  # refuses a base that cannot generate
    names = side.check_tasks(None if params.tasks is None else list(params.tasks))
    for n in list(params.answer_only) + [h for h, _ in params.guard]:
        if n not in names:
            raise DataError(f"unknown task {n!r} in answer_only/guard; asked: {', '.join(names)}")
    if not prompts:
        raise DataError("no prompts")
    for i, p in enumerate(prompts):
        if not isinstance(p, str) or not p.strip():
            raise DataError(f"prompt {i + 1} is empty")
    if int(params.max_new_tokens) < 1:
        raise DataError(f"max_new_tokens must be at least 1, got {params.max_new_tokens}")
    guard = guard_rules(side, params.guards)
    eos = set() if params.ignore_eos else decoder.eos_ids()  # ignore_eos: always max_new_tokens (benchmarks)
    return names, guard, eos


@dataclass
class Row:
    """One prompt's generation inside a batch of rows (infer/batching.Batch, infer/gguf_steps.SequenceBatch)."""
    owner: object                 # the request it belongs to (Job)
    index: int                    # its prompt's index in that request
    prompt_ids: list[int]
    offsets: list[tuple[int, int]]  # character offsets of its prefill columns (padding: (0, 0))
    start: int                    # batch column of its first prefill column (a batch without columns: 0)
    answer_from: int              # batch column of its first generated token (without columns: the prompt's length)
    generated: list[int] = field(default_factory=list)
    finish: str | None = None
    steps: dict = field(default_factory=dict)  # head -> per-token values (steps or guard)
    guard: dict | None = None     # the guard that ended it: {head, label, value, token} (token 0: the prompt)
    answer: AnswerText | None = None  # the generated tokens' text and spans, kept as they come (from the first)


class Job:
    """One generation request: its prompts, settings (GenerationParams), events (a queue: "prompt", "step"s,
    "done") and results."""

    def __init__(self, side, prompts: list[str], params: GenerationParams):
        self.names, self.guard, self.eos = check_request(side, prompts, params)
        self.params, self.prompts, self.max_new = params, list(prompts), int(params.max_new_tokens)
        self.answer_only, self.stop = set(params.answer_only), params.stop
        self.generator = generator(params.sampling.seed)  # its own draws (infer/sampling.py)
        self.stepped = [n for n in self.names
                        if side.heads[n].kind != TaskKind.TOKENS and (params.steps or n in self.guard)]
        self.wrapped = list(prompts) if params.raw else side.wrap(prompts)[0]  # the heads' task.template (e.g. chat)
        self.events: queue.Queue = queue.Queue()
        self.cancelled = threading.Event()
        self.step, self.results, self.prompt_json = 0, [None] * len(prompts), None


def job_events(job: Job, advance: Callable[[], None] | None = None) -> Iterator[dict]:
    """The job's events in order, to its "done" (an error put in its queue is raised). When the queue is empty,
    advance() moves the generation on (a lone request's next step, run by its consumer); without it the wait
    blocks (serve's scheduler thread fills the queue). However it ends, the job is cancelled after: its rows
    leave at the next step."""
    try:
        while True:
            if advance is not None and job.events.empty():
                advance()
                continue
            event = job.events.get()
            if isinstance(event, BaseException):
                raise event
            yield event
            if event["event"] == "done":
                return
    finally:
        job.cancelled.set()


class Stream:
    """A generation's events, iterated by one consumer; cancel() ends it from any other thread (a deadline, a
    client gone): the request leaves the queue, or its rows leave at the next decode step, and a consumer
    waiting for its next event gets Cancelled at once instead of when the request is admitted."""

    def __init__(self, events: Iterator[dict], job: Job):
        self._events, self.job = events, job

    def __iter__(self) -> "Stream":
        return self

    def __next__(self) -> dict:
        return next(self._events)

    def close(self) -> None:
        """The consumer stops reading (call it from the consuming thread; cancel() from any other)."""
        self._events.close()
        self.job.cancelled.set()

    def cancel(self, why: str = "the generation was cancelled") -> None:
        self.job.cancelled.set()
        self.job.events.put(Cancelled(why))
