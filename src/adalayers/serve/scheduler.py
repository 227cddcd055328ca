"""Continuous batching of generation: one scheduler thread owns the decode loop of the service.

    scheduler = Scheduler(side)
    events = scheduler.stream(prompts, max_new_tokens=32, tasks=[...], ...)   # serve/generate.stream's
    # arguments and events: "prompt" (after the prefill), one "step" per token, then "done"

A new request waits in a queue. Between two decode steps the scheduler prefills every waiting request
(all their prompts as one left-padded batch, the heads' hooks on: one forward) and merges their rows into
the running batch (serve/batching.Batch: rows line up on the right, per-row positions, masks, accumulators
and KV cache); then one decode step runs for all rows of all requests together. A row leaves as soon as it ends
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

import torch

from adalayers.kinds import TaskKind
from adalayers.infer.batching import Batch, Row
from adalayers.infer.generate import (_answer, _cut, _offsets, _output, _sample, answer_text, cache_of,
                                      check_request, forward_step, read_head)

log = logging.getLogger(__name__)


class Job:
    """One request: its prompts, settings, events queue and results."""

    def __init__(self, side, prompts: list[str], max_new_tokens: int = 32, tasks: list[str] | None = None,
                 do_sample: bool = False, temperature: float = 1.0, top_k: int = 0, seed: int | None = None,
                 steps: bool = False, answer_only=(), guard=None, ignore_eos: bool = False, top_p: float = 1.0,
                 stop=(), raw: bool = False):
        self.names, self.guard, self.eos = check_request(side, prompts, max_new_tokens, tasks, answer_only, guard,
                                                         ignore_eos)
        self.prompts, self.max_new, self.answer_only, self.stop = list(prompts), int(max_new_tokens), set(answer_only), stop
        self.sampling = (do_sample, temperature, top_k, torch.Generator().manual_seed(seed) if seed is not None else None,
                         top_p)
        self.stepped = [n for n in self.names if side.heads[n].kind != TaskKind.TOKENS and (steps or n in self.guard)]
        self.wrapped = list(prompts) if raw else side.wrap(prompts)[0]
        self.events: queue.Queue = queue.Queue()
        self.cancelled = threading.Event()
        self.step, self.results, self.prompt_json = 0, [None] * len(prompts), None


class Scheduler:
    @staticmethod
    def supports(backbone) -> bool:
        """A transformers decoder (its DynamicCache is what serve/batching merges and splits); other runtimes
        (llama.cpp) generate per request through serve/generate.stream."""
        from adalayers.model.backbone import Backbone

        return isinstance(backbone, Backbone) and backbone.is_causal

    def __init__(self, side, max_rows: int = 64):
        self.side, self.max_rows = side, max_rows
        self.heads = list(side.heads.values())
        self.waiting: queue.Queue = queue.Queue()
        self._thread, self._start = None, threading.Lock()

    def stream(self, prompts: list[str], **kw) -> Iterator[dict]:
        """serve/generate.stream's events for this request, decoded together with every other running one.
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
            return [self._prefill(jobs)]
        except Exception:  # noqa: BLE001
            if len(jobs) == 1:
                jobs[0].events.put(sys.exc_info()[1])
                return []
        return [b for job in jobs for b in self._prefilled([job])]

    def _prefill(self, jobs: list[Job]) -> Batch:
        side, tok = self.side, self.side.backbone.tokenizer
        wrapped = [w for job in jobs for w in job.wrapped]
        enc = tok(wrapped, padding=True, truncation=True, max_length=side.max_length, return_tensors="pt",
                  return_offsets_mapping=tok.is_fast)
        ids, attn = enc["input_ids"].to(side.backbone.device), enc["attention_mask"].to(side.backbone.device)
        out, accs = forward_step(side, self.heads, ids, attn, None)
        real, rows, start, events = attn.bool(), [], 0, []
        for job in jobs:
            mine = list(range(start, start + len(job.prompts)))
            start += len(job.prompts)
            values = {n: read_head(side, n, accs[n][mine], real[mine]) for n in job.names}
            job.prompt_json = [{n: _output(side.heads[n], values[n][j], _offsets(enc, b), job.wrapped[j])
                                for n in job.names} for j, b in enumerate(mine)]
            prompt_ids = [ids[b][real[b]].tolist() for b in mine]
            events.append((job, {"event": "prompt", "results": job.prompt_json, "token_ids": prompt_ids}))
            rows += [Row(job, j, prompt_ids[j], _offsets(enc, b), 0, attn.shape[1]) for j, b in enumerate(mine)]
        for job, event in events:  # only once the whole prefill has succeeded
            job.events.put(event)
        return Batch(rows, attn, real, accs, cache_of(out), out.logits[:, -1])

    def _step(self, batch: Batch) -> Batch | None:
        """One token for every row; rows that end leave; each request gets its step (and done) event."""
        side, tok, rows = self.side, self.side.backbone.tokenizer, batch.rows
        nxt = torch.empty(len(rows), dtype=torch.long, device=batch.logits.device)
        for job, idx in _by_job(rows).items():
            nxt[idx] = _sample(batch.logits[idx], *job.sampling)
        live = [int(t) not in r.owner.eos for t, r in zip(nxt.tolist(), rows)]
        for r, t, ok in zip(rows, nxt.tolist(), live):
            if not ok:
                r.finish = "eos"
                continue
            r.generated.append(t)
            if r.owner.stop and any(s in answer_text(tok, r.prompt_ids, r.generated) for s in r.owner.stop):
                r.finish = "stop"
            elif len(r.generated) >= r.owner.max_new:
                r.finish = "length"
        step = {id(r.owner): r.owner for r in rows}
        events = {j: {"tokens": [None] * len(j.prompts), "ids": [None] * len(j.prompts),
                      "values": {n: [None] * len(j.prompts) for n in j.stepped}} for j in step.values()}
        ended = [i for i, ok in enumerate(live) if not ok]
        self._finish(batch, ended)  # end of text: that token is not read
        going = [i for i, ok in enumerate(live) if ok]
        batch, nxt = batch.keep(going), nxt[going]
        if batch.rows:
            batch.grow(torch.ones(len(batch.rows), dtype=torch.bool, device=nxt.device))
            out, new = forward_step(side, self.heads, nxt.unsqueeze(1), batch.attn, batch.cache)
            batch.accs = {n: torch.cat([batch.accs[n], v], 1) for n, v in new.items()}
            batch.cache, batch.logits = cache_of(out), out.logits[:, -1]
            self._step_values(batch, nxt, events)
        for job in step.values():
            job.events.put({"event": "step", "step": job.step, **events[job]})
            job.step += 1
        done = [i for i, r in enumerate(batch.rows) if r.finish]
        self._finish(batch, done)
        for job in step.values():
            if all(r is not None for r in job.results):
                job.events.put({"event": "done", "results": job.results})
        batch = batch.keep([i for i, r in enumerate(batch.rows) if not r.finish]) if done else batch
        return batch if batch.rows else None

    def _step_values(self, batch: Batch, nxt: torch.Tensor, events: dict) -> None:
        """Per-token text and ids; per-step values of the heads asked for (steps or a guard); guards."""
        tok = self.side.backbone.tokenizer
        needed = sorted({n for r in batch.rows for n in r.owner.stepped})
        values = {n: self._read(batch, n, list(range(len(batch.rows)))) for n in needed}
        for i, (r, t) in enumerate(zip(batch.rows, nxt.tolist())):
            ev = events[r.owner]
            ev["tokens"][r.index], ev["ids"][r.index] = tok.decode([t]), t
            for n in r.owner.stepped:
                v = values[n][i].tolist()
                ev["values"][n][r.index] = v
                r.steps.setdefault(n, []).append(v)
            for n, (label, threshold) in r.owner.guard.items():
                if values[n][i][self.side.heads[n].task.labels.index(label)] >= threshold:
                    r.finish = "guard"

    def _read(self, batch: Batch, name: str, idx: list[int]) -> torch.Tensor:
        """Head `name` on the rows at idx: those whose request reads the answer alone under the answer mask."""
        only = [i for i in idx if name in batch.rows[i].owner.answer_only]
        plain = [i for i in idx if i not in only]
        out = [None] * len(batch.rows)
        for sel, answer in ((plain, False), (only, True)):
            if sel:
                mask = batch.answer_mask(sel) if answer else batch.real[sel]
                for i, v in zip(sel, read_head(self.side, name, batch.accs[name][sel], mask, answer)):
                    out[i] = v
        return torch.stack([out[i] for i in idx])

    def _finish(self, batch: Batch, idx: list[int]) -> None:
        """The results of the rows at idx (they leave the batch after this)."""
        tok = self.side.backbone.tokenizer
        for i in idx:
            r, job = batch.rows[i], batch.rows[i].owner
            answer, spans = _answer(tok, r.prompt_ids, r.generated)
            wrapped = job.wrapped[r.index]
            res = {"prompt": job.prompts[r.index], "text": _cut(answer, job.stop), "tokens": len(r.generated),
                   "token_ids": r.generated, "finish": r.finish or "length", "prompt_tasks": job.prompt_json[r.index],
                   "tasks": {}}
            for n in job.names:
                value = self._read(batch, n, [i])[0]
                if self.side.heads[n].kind == TaskKind.TOKENS:
                    value = value[r.start:]
                res["tasks"][n] = _output(self.side.heads[n], value, r.offsets, wrapped + answer,
                                          [(len(wrapped) + a, len(wrapped) + e) for a, e in spans])
            if job.stepped:
                res["steps"] = {n: r.steps.get(n, []) for n in job.stepped}
            job.results[r.index] = res


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


def _by_job(rows: list[Row]) -> dict:
    groups: dict = {}
    for i, r in enumerate(rows):
        groups.setdefault(r.owner, []).append(i)
    return groups
