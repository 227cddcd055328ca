"""Side tasks read during text generation: one pass of a decoder LLM serves its text and every head.

    side = SideTasks.load("gemma3-270m", ["runs/cola_gemma"])
    side.generate(["Write one sentence about cats."], max_new_tokens=32)
    # [{"prompt", "text", "finish": "length"|"eos"|"guard", "tokens",
    #   "prompt_tasks": {name: prediction on the prompt},          <- from the prefill's hooks
    #   "tasks": {name: prediction on prompt + answer (or on the answer alone, per head)},
    #   "steps": {name: [one value per generated token]}}]         <- sequence heads, with steps=True

How. The prompts are left-padded (every row's last token sits in the last column) and run once
(prefill) with the layer hooks on: each head's accumulator F (B, T, k) is filled exactly as in
SideTasks.predict, and the prompt predictions are read from it, with no extra forward. Each decode
step then feeds one token per row with the KV cache on; the hooks see Z_i of that one position and
each head's accumulator grows by one column. Mixer and projections act per token and a decoder
token never sees later ones, so after the last step F equals what one pass over the whole text
gives, and so does every head's prediction (tests/test_generate.py checks 1e-5). The last
generated token is fed once more (one extra decode step) so that the heads also read it; no row
needs a next token then, so that step skips the LM head (Gemma 3 270M's, 640 x 262,144, is more
work per token than the rest of the model) and ends after the deepest layer a head reads. In any
step, the LM head runs only on the rows that go on (a row of a shared batch may be ending).

A row leaves the batch as soon as it ends (end-of-text token, max tokens, stop string, guard); the
rows of several requests share one batch (adalayers.infer.batching), so one loop (Generation: prefill,
step) serves a single call here and serve's continuous-batching scheduler alike. With `steps` (or a `guard`),
sequence heads are read after every step: the head (small next to the base) runs on the F so far.
A guard {head: (label, threshold)} stops a row once that head gives the label at least that
probability (a streaming guard, e.g. a policy head), on the prompt after the prefill too (infer/guarding.py).
"""
from __future__ import annotations

from typing import Callable, Iterator, Protocol

import numpy as np

from adalayers.errors import Cancelled
from adalayers.infer.answers import AnswerText, cut
from adalayers.infer.guarding import guard_trip, prompt_trips
from adalayers.infer.heads import used_layers
from adalayers.infer.outputs import head_output
from adalayers.infer.params import GenerationParams
from adalayers.infer.request import Job, Row, Stream, job_events
from adalayers.infer.sampling import sample
from adalayers.kinds import TaskKind

__all__ = ["Generation", "GenerationParams", "Job", "Passes", "Stream", "generate", "sample", "start", "stream"]


class Passes(Protocol):
    """What Generation asks of a runtime: its passes over a batch of rows (infer/batching.TorchPasses: a
    left-padded torch Batch; infer/gguf_steps.SequencePasses: llama.cpp sequences and numpy heads, no torch).
    A batch has `rows` (Row), `logits` (numpy (B, V), or None inside a step), keep(idx) and merge(other)."""

    def prefill(self, wrapped: list[str], cancelled, between: Callable[[int], None] | None = None
                ) -> tuple[object, list[tuple]]:
        """The texts as one batch, one pass with every head tapping it (its rows still empty), and per text
        (prompt ids, character offsets per column, first prefill column, first answer column). cancelled():
        True once nobody waits for the pass (a runtime that can stop between layers stops). between(n): a
        runtime whose prefill runs in pieces calls it after each piece but the last (n: its prompt tokens),
        when other batches may step; one that runs it whole never does."""

    def decode(self, batch, nxt: np.ndarray, go_on: list[int], deepest: int | None,
               reads: list[tuple[list[str], list[int]]] = ()) -> np.ndarray | None:
        """Feed every row its token nxt[b] (the heads tap it); the LM head on go_on's rows only (-> their logits;
        none at all: the pass may end after state `deepest`). Sets batch.logits (None unless every row goes on).
        reads: the read(batch, names, rows, False) calls the step will make next; a runtime may do them during
        the pass, to be answered from there (the values must be those read would give)."""

    def read(self, batch, names: list[str], rows: list[int], answer_alone: bool) -> dict[str, list[np.ndarray]]:
        """Heads `names` on the rows at `rows`: per head, per row, class probabilities (a token head: per column)
        or the value; answer_alone: over the generated tokens only."""


def stream(side, prompts: list[str], max_new_tokens: int = 32, tasks: list[str] | None = None,
           **kw) -> Stream:
    """Generate, yielding {"event": "prompt", "results": [per prompt {task: output}], "token_ids": [per prompt]}
    after the prefill, {"event": "step", "step", "tokens": [text piece per prompt, None once ended],
    "ids": [token id per prompt, None once ended], "values": {task: [per prompt, None once ended]}} per token,
    then {"event": "done", "results": [...]} (what `generate` returns).

    Options (GenerationParams.of): do_sample, temperature, top_k, top_p, seed; steps (sequence heads' values
    after every token); answer_only (heads that read the answer alone); guard {head: (label, threshold)}; ignore_eos;
    stop: strings that end a prompt's answer ("finish": "stop") once its text holds one (the token that
    completes it is the row's last, and "text" is cut before it); raw: the prompts are the text the base
    reads as they are (e.g. a rendered chat), the heads' task.template is not applied.

    The loop is Generation's, as in serve's scheduler, for this one request. The predictor's lock and the
    hooks are held for one forward at a time, never across a yield: a server resumes this generator on any
    thread (or drops it when the client leaves), and requests of others run between two steps.
    """
    return start(side, prompts, GenerationParams.of(max_new_tokens, tasks, **kw))


def start(side, prompts: list[str], params: GenerationParams) -> Stream:
    """stream, from typed params (what the service calls when it generates per request)."""
    job = Job(side, prompts, params)
    return Stream(_alone(side, job), job)


def _alone(side, job: Job) -> Iterator[dict]:
    """One request's loop, run by its consumer between reads (the prefill at the first read); a cancel() stops it
    before the next step."""
    loop, batch = None, None

    def advance() -> None:
        nonlocal loop, batch
        if loop is None:
            loop = Generation(side, [side.heads[n] for n in job.names])
            batch = loop.prefill([job])
        elif batch is None:
            raise RuntimeError("generation ended without a result")  # unreachable: the last step sends "done"
        elif job.cancelled.is_set():
            raise Cancelled("the generation was cancelled")
        else:
            batch = loop.step(batch)
    return job_events(job, advance)


def generate(side, prompts: list[str], max_new_tokens: int = 32, tasks: list[str] | None = None,
             **kw) -> list[dict]:
    """Text plus every side task's prediction, from the generation pass itself (see the module doc)."""
    for event in stream(side, prompts, max_new_tokens, tasks, **kw):
        if event["event"] == "done":
            return event["results"]
    raise RuntimeError("generation ended without a result")  # unreachable: stream always ends with done


class Generation:
    """The one generation loop: prefill requests (Jobs) into a batch, then decode steps until its rows end.
    Every head in `heads` accumulates on every row (one pass feeds them all); each request reads its own.
    Sampling runs per request with its own generator, so a seed gives the same text whatever runs beside it.
    What a pass is belongs to the runtime (side.generation_passes: Passes)."""

    def __init__(self, side, heads: list | None = None):
        self.side, self.tok = side, side.backbone.tokenizer
        self.heads = list(side.heads.values()) if heads is None else heads
        self.passes: Passes = side.generation_passes(self.heads)
        self.deepest = used_layers(self.heads)[-1] if self.heads else None

    def prefill(self, jobs: list[Job], between: Callable[[int], None] | None = None):
        """The jobs' prompts as one batch, one pass with the heads tapping it; each job gets its "prompt" event
        once the whole prefill has succeeded; rows whose prompt trips a guard end (None: all did). between: see
        Passes.prefill (serve's scheduler steps the running rows there)."""
        wrapped = [w for job in jobs for w in job.wrapped]
        batch, columns = self.passes.prefill(wrapped, lambda: all(j.cancelled.is_set() for j in jobs), between)
        start, events = 0, []
        for job in jobs:
            mine = list(range(start, start + len(job.prompts)))
            start += len(job.prompts)
            rows = [Row(job, j, *columns[b]) for j, b in enumerate(mine)]
            batch.rows += rows
            values = self.passes.read(batch, job.names, mine, False)
            job.prompt_json = [{n: _output(self.side.heads[n], values[n][j], r.offsets, job.wrapped[j])
                                for n in job.names} for j, r in enumerate(rows)]
            events.append((job, {"event": "prompt", "results": job.prompt_json,
                                 "token_ids": [r.prompt_ids for r in rows]}))
            prompt_trips(self.side, job, rows, values)
        for job, event in events:
            job.events.put(event)
        return self._prompt_guards(batch)

    def _prompt_guards(self, batch):
        """Rows whose prompt tripped a guard end, having generated nothing (-> the rest; None: none is left)."""
        tripped, failed = [i for i, r in enumerate(batch.rows) if r.finish], {}
        self._finish(batch, tripped, failed)
        for job in {id(batch.rows[i].owner): batch.rows[i].owner for i in tripped}.values():
            if job in failed:
                job.events.put(failed[job])
                job.cancelled.set()
            elif all(r is not None for r in job.results):
                job.events.put({"event": "done", "results": job.results})
        batch = batch.keep([i for i, r in enumerate(batch.rows) if not r.finish and r.owner not in failed])
        return batch if batch.rows else None  # keep([]) gives the rows' KV cache back (llama.cpp sequences)

    def step(self, batch):
        """One token for every row; rows that end leave; each request gets its step (and done) event.
        -> the rows still going (None: none). What is one request's own (sampling, stop strings, its heads'
        outputs) fails that request alone: it gets the error and its rows leave; the forward is everyone's."""
        rows, failed = batch.rows, {}
        nxt = np.zeros(len(rows), np.int64)
        for job, idx in _by_job(rows).items():
            _own(failed, job, lambda: nxt.__setitem__(idx, sample(batch.logits[idx], job.params.sampling,
                                                                 job.generator)))
        live = [r.owner not in failed and int(t) not in r.owner.eos for t, r in zip(nxt.tolist(), rows)]
        for r, t, ok in zip(rows, nxt.tolist(), live):
            if ok:
                _own(failed, r.owner, lambda: self._next_token(r, t))
            elif r.owner not in failed:
                r.finish = "eos"
        self._finish(batch, [i for i, r in enumerate(rows) if r.finish == "eos"], failed)  # that token is not read
        going = [i for i, (ok, r) in enumerate(zip(live, rows)) if ok and r.owner not in failed]
        batch, nxt = batch.keep(going), nxt[going]
        go_on = [i for i, r in enumerate(batch.rows) if not r.finish]  # the rows that need next-token logits
        logits, needed = None, sorted({n for r in batch.rows for n in r.owner.stepped})  # heads read each step
        if batch.rows and (self.heads or go_on):  # heads read the last token too
            reads = [(names, list(sel)) for (sel, alone), names in
                     _read_calls(batch, needed, list(range(len(batch.rows)))).items() if not alone]
            logits = self.passes.decode(batch, nxt, go_on, None if go_on else self.deepest, reads)
        jobs = [j for j in {id(r.owner): r.owner for r in rows}.values() if j not in failed]
        events = {j: {"tokens": [None] * len(j.prompts), "ids": [None] * len(j.prompts),
                      "values": {n: [None] * len(j.prompts) for n in j.stepped}} for j in jobs}
        self._step_values(batch, nxt, needed, events, failed)
        self._finish(batch, [i for i, r in enumerate(batch.rows) if r.finish], failed)
        for job in jobs:
            if job in failed:
                continue
            job.events.put({"event": "step", "step": job.step, **events[job]})
            job.step += 1
            if all(r is not None for r in job.results):
                job.events.put({"event": "done", "results": job.results})
        for job, error in failed.items():
            job.events.put(error)
            job.cancelled.set()
        keep = [i for i, r in enumerate(batch.rows) if not r.finish and r.owner not in failed]
        batch = batch.keep(keep)
        if batch.rows and batch.logits is None:  # the LM head ran on go_on's rows only
            batch.logits = logits[[go_on.index(i) for i in keep]]
        return batch if batch.rows else None

    def _next_token(self, r: Row, t: int) -> None:
        r.generated.append(t)
        if r.answer is None:
            r.answer = AnswerText(self.tok, r.prompt_ids)
        r.answer.add(t)
        if r.owner.stop and any(s in r.answer.text for s in r.owner.stop):
            r.finish = "stop"
        elif len(r.generated) >= r.owner.max_new:
            r.finish = "length"

    def _step_values(self, batch, nxt: np.ndarray, needed: list[str], events: dict, failed: dict) -> None:
        """Per-token text and ids; per-step values of the heads asked for (steps or a guard); guards."""
        values = self._read(batch, needed, list(range(len(batch.rows))))
        for i, (r, t) in enumerate(zip(batch.rows, nxt.tolist())):
            _own(failed, r.owner, lambda: self._row_values(r, t, {n: v[i] for n, v in values.items()},
                                                         events[r.owner]))

    def _row_values(self, r: Row, t: int, values: dict, ev: dict) -> None:
        ev["tokens"][r.index], ev["ids"][r.index] = self.tok.decode([t]), t
        for n in r.owner.stepped:
            v = values[n].tolist()
            ev["values"][n][r.index] = v
            r.steps.setdefault(n, []).append(v)
        r.guard = guard_trip(self.side, r.owner.guard, values, len(r.generated)) if r.owner.guard else None
        r.finish = "guard" if r.guard else r.finish

    def _read(self, batch, names: list[str], idx: list[int]) -> dict[str, list[np.ndarray]]:
        """Heads `names` on the rows at idx, per head in idx's order: a row whose request reads a head on the
        answer alone over its answer. Heads that read the same rows the same way are read together."""
        out = {n: [None] * len(batch.rows) for n in names}
        for (sel, alone), group in _read_calls(batch, names, idx).items():
            for n, values in self.passes.read(batch, group, list(sel), alone).items():
                for i, v in zip(sel, values):
                    out[n][i] = v
        return {n: [out[n][i] for i in idx] for n in names}

    def _finish(self, batch, idx: list[int], failed: dict) -> None:
        """The results of the rows at idx (they leave the batch after this)."""
        for i in idx:
            _own(failed, batch.rows[i].owner, lambda: self._result(batch, i))

    def _result(self, batch, i: int) -> None:
        r, job = batch.rows[i], batch.rows[i].owner
        text, spans = (r.answer.text, r.answer.spans) if r.answer else ("", [])
        wrapped = job.wrapped[r.index]
        res = {"prompt": job.prompts[r.index], "text": cut(text, job.stop), "tokens": len(r.generated),
               "token_ids": r.generated, "finish": r.finish or "length", "prompt_tasks": job.prompt_json[r.index],
               "tasks": {}, **({"guard": r.guard} if r.guard else {})}
        for n in job.names:
            value = self._read(batch, [n], [i])[n][0]
            if self.side.heads[n].kind == TaskKind.TOKENS:
                value = value[r.start:]
            res["tasks"][n] = _output(self.side.heads[n], value, r.offsets, wrapped + text,
                                      [(len(wrapped) + a, len(wrapped) + e) for a, e in spans])
        if job.stepped:
            res["steps"] = {n: r.steps.get(n, []) for n in job.stepped}
        job.results[r.index] = res


def _own(failed: dict, job: Job, work) -> None:
    """Run one request's own part of a step; an error fails that request (recorded in `failed`), not the step.
    A request that has failed already is skipped."""
    if job in failed:
        return
    try:
        work()
    except Exception as e:  # noqa: BLE001  (any error of one request's own work is that request's answer)
        failed[job] = e


def _read_calls(batch, names: list[str], idx: list[int]) -> dict[tuple[tuple[int, ...], bool], list[str]]:
    """Generation._read's calls of Passes.read: (rows, answer alone) -> the heads read together on them."""
    calls: dict[tuple, list[str]] = {}
    for n in names:
        only = tuple(i for i in idx if n in batch.rows[i].owner.answer_only)
        plain = tuple(i for i in idx if i not in only)
        for sel, alone in ((plain, False), (only, True)):
            if sel:
                calls.setdefault((sel, alone), []).append(n)
    return calls


def _by_job(rows: list[Row]) -> dict:
    """Each job's rows: a slice where they are consecutive (as a job's rows join; its logits then a view, not a
    copy: 1 MB a row of Gemma 3's vocabulary, 4% of a gemma3-270m decode step on 2 threads), else their indices."""
    groups: dict = {}
    for i, r in enumerate(rows):
        groups.setdefault(r.owner, []).append(i)
    return {job: slice(ix[0], ix[-1] + 1) if ix[-1] - ix[0] == len(ix) - 1 else ix for job, ix in groups.items()}


def _output(head, values, offsets: list[tuple[int, int]] | None, text: str,
            answer_offsets: list[tuple[int, int]] | None = None) -> dict:
    """A head's values -> the same JSON as /predict gives (adalayers.infer.outputs). Token heads: the row's
    columns are the prompt (left-padded in a torch batch), then the generated tokens."""
    return head_output(head.kind, head.task.labels, values, text, list(offsets or []) + list(answer_offsets or []))
