"""Continuous batching (serve/scheduler.py): requests that join a running batch between decode steps, with rows
that leave as they end, get what each gets decoding alone (serve/generate.stream), on tiny random decoders with
full attention (Llama) and sliding-window layers (Gemma 3), with sequence and token heads."""
from __future__ import annotations

import threading
import time

import pytest

from adalayers.errors import DataError
from adalayers.infer.sidetasks import SideTasks
from adalayers.infer.generate import generate
from adalayers.serve.scheduler import Scheduler
from runs_util import NER, assert_json_close, make_run
from tinydecoders import decoder_backbone

REQUESTS = [(["the dog runs quickly and", "a book"], dict(max_new_tokens=6, steps=True)),
            (["she loves the big movie"], dict(max_new_tokens=9, tasks=["acc"], answer_only=["acc"])),
            (["a"], dict(max_new_tokens=3, tasks=[])),
            (["the cat sees a dog and it is good . they love it"],
             dict(max_new_tokens=12, do_sample=True, temperature=1.0, seed=5, steps=True)),
            (["john"], dict(max_new_tokens=7, guard={"acc": ("good", 0.6)})),
            (["mary sees"], dict(max_new_tokens=8, stop=["dog"], do_sample=True, seed=2))]


def _close(a, b, where=""):
    """Equal JSON, floats within 1e-4."""
    assert_json_close(a, b, 1e-4, where)


@pytest.mark.parametrize("kind,stagger", [("llama", 0.02), ("gemma3", 0.02), ("llama", 0.0)])
def test_requests_joining_between_steps_get_what_they_get_alone(kind, stagger, tmp_path):
    """stagger 0: the requests arrive together and share one prefill; 0.02 s: later ones join a decoding batch."""
    base = decoder_backbone(kind)
    side = SideTasks.from_backbone(base, [make_run(tmp_path / "acc", base, "sequence", ["bad", "good"], seed=3),
                                          make_run(tmp_path / "ner", base, "token", NER, seed=4)])
    scheduler = Scheduler(side)
    rows_per_step, step = [], scheduler._step
    two_queued, queued, count = threading.Event(), [], threading.Lock()

    def recorded(batch):  # the first step waits until a second request is queued, so one joins a running batch
        if not rows_per_step:  # whatever the machine's speed (the tiny model may finish a request in 20 ms)
            two_queued.wait(timeout=60)
        rows_per_step.append(len(batch.rows))
        return step(batch)

    scheduler._step = recorded
    got = [None] * len(REQUESTS)

    def client(i):
        events = scheduler.stream(REQUESTS[i][0], **REQUESTS[i][1])  # queued when stream() returns
        with count:
            queued.append(i)
            if len(queued) >= 2:
                two_queued.set()
        got[i] = list(events)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(REQUESTS))]
    for t in threads:  # staggered: later requests join a batch that is already decoding
        t.start()
        time.sleep(stagger)
    for t in threads:
        t.join(timeout=120)
    assert max(rows_per_step) > 2 and len(set(rows_per_step)) > 1  # rows joined and left
    for (prompts, kw), events in zip(REQUESTS, got):
        kinds = [e["event"] for e in events]
        assert kinds[0] == "prompt" and kinds[-1] == "done" and set(kinds[1:-1]) == {"step"}
        alone = generate(side, prompts, **kw)
        for mine, ref in zip(events[-1]["results"], alone):
            assert mine["text"] == ref["text"]
            _close(mine, ref)


def test_a_bad_request_fails_alone_before_it_is_queued(tmp_path):
    base = decoder_backbone("llama")
    side = SideTasks.from_backbone(base, [make_run(tmp_path / "acc", base, "sequence", ["bad", "good"], seed=3)])
    scheduler = Scheduler(side)
    with pytest.raises(DataError, match="one of its labels"):
        scheduler.stream(["a"], guard={"acc": ("meh", 0.5)})
    events = scheduler.stream(["the dog"], max_new_tokens=2)
    next(events)
    events.close()  # a consumer that leaves: its rows leave at the next step
    assert list(scheduler.stream(["a book"], max_new_tokens=2))[-1]["results"][0]["tokens"] <= 2


def test_a_request_waiting_for_room_is_cancelled_at_once(tmp_path):
    """Stream.cancel() (a deadline, a client gone) from another thread: a consumer blocked on a request that
    still waits for room gets Cancelled at once, not when the request is admitted, and the request never runs."""
    from adalayers.errors import Cancelled

    base = decoder_backbone("llama")
    side = SideTasks.from_backbone(base, [make_run(tmp_path / "acc", base, "sequence", ["bad", "good"], seed=3)])
    scheduler = Scheduler(side, max_rows=1)  # one row at a time: a second request waits for room
    go, step = threading.Event(), scheduler._step
    scheduler._step = lambda batch: (go.wait(timeout=60), step(batch))[1]  # the first request holds the room
    first = scheduler.stream(["the dog runs"], max_new_tokens=8, ignore_eos=True)
    assert next(first)["event"] == "prompt"
    second = scheduler.stream(["a book"], max_new_tokens=2)
    got = []

    def consume():
        try:
            got.append(next(second))
        except Cancelled as e:
            got.append(e)

    reader = threading.Thread(target=consume)
    reader.start()
    second.cancel("its deadline passed")
    reader.join(timeout=10)
    assert not reader.is_alive() and isinstance(got[0], Cancelled) and "deadline" in str(got[0])
    go.set()
    events = list(first)
    assert events[-1]["event"] == "done" and events[-1]["results"][0]["tokens"] == 8
    deadline = time.time() + 30  # the loop takes the cancelled request from the queue once the first has left
    while scheduler.stats()["generations_waiting"] and time.time() < deadline:
        time.sleep(0.01)
    assert scheduler.stats()["largest_step_rows"] == 1 and scheduler.stats()["generations_waiting"] == 0


@pytest.mark.parametrize("where", ["sample", "output", "stop"])
def test_a_request_whose_own_step_work_fails_fails_alone(where, tmp_path, monkeypatch):
    """One request's own part of a shared decode step (its sampling, its heads' outputs, its stop strings) raises:
    that request gets the error and its rows leave; the requests decoding beside it get what they get alone."""
    from adalayers.infer import generate as gen

    base = decoder_backbone("llama")
    side = SideTasks.from_backbone(base, [make_run(tmp_path / "acc", base, "sequence", ["bad", "good"], seed=3)])
    good = [(["the dog runs quickly and"], dict(max_new_tokens=6, steps=True)),
            (["a book", "she loves"], dict(max_new_tokens=5, ignore_eos=True))]
    alone = [generate(side, p, **kw) for p, kw in good]
    bad_kw = dict(max_new_tokens=6, ignore_eos=True, temperature=0.5, do_sample=True, seed=1)
    if where == "stop":
        bad_kw["stop"] = ["zzz"]
    broken = RuntimeError(f"one request's {where} failed")
    if where == "sample":
        real = gen.sample
        monkeypatch.setattr(gen, "sample", lambda logits, sampling, g: (_ for _ in ()).throw(broken)
                            if sampling.temperature == 0.5 else real(logits, sampling, g))
    elif where == "output":
        real_output = gen._output
        monkeypatch.setattr(gen, "_output", lambda head, values, offsets, text, answer=None:
                            (_ for _ in ()).throw(broken) if text.startswith("mary") and answer
                            else real_output(head, values, offsets, text, answer))
    else:
        class Failing(gen.AnswerText):  # the answer's text, which the stop strings are looked for in
            def add(self, token):
                if "mary" in self.tok.decode(self.prompt_ids):
                    raise broken
                return super().add(token)

        monkeypatch.setattr(gen, "AnswerText", Failing)
    scheduler = Scheduler(side)
    go, step = threading.Event(), scheduler._step
    scheduler._step = lambda batch: (go.wait(timeout=60), step(batch))[1]  # all three prefilled before step 1
    streams = [scheduler.stream(p, **kw) for p, kw in good] + [scheduler.stream(["mary sees"], **bad_kw)]
    firsts = [next(s) for s in streams]  # every request's prefill has run
    go.set()
    assert all(f["event"] == "prompt" for f in firsts)
    with pytest.raises(RuntimeError, match=f"one request's {where} failed"):
        list(streams[2])
    for s, ref in zip(streams[:2], alone):
        events = list(s)
        assert events[-1]["event"] == "done"
        for mine, want in zip(events[-1]["results"], ref):
            assert mine["text"] == want["text"]
            _close(mine, want)
    assert scheduler.stats()["largest_step_rows"] == 4  # the three requests did share steps


def test_a_prefill_nobody_waits_for_stops_between_layers(tmp_path):
    """The client leaves (or the deadline passes) while its request's prefill runs: the pass ends at the next
    layer (the layers after it never run), the request gets Cancelled, and the next request is answered."""
    from adalayers.errors import Cancelled

    base = decoder_backbone("llama")
    side = SideTasks.from_backbone(base, [make_run(tmp_path / "acc", base, "sequence", ["bad", "good"], seed=3)])
    scheduler = Scheduler(side)
    layers = base.model.model.layers
    reached, leaving = [], []
    first = layers[0].register_forward_hook(lambda *_: [s.job.cancelled.set() for s in leaving])
    last = layers[-1].register_forward_hook(lambda *_: reached.append(True))
    try:
        go, prefilled = threading.Event(), scheduler._prefilled
        scheduler._prefilled = lambda *a: (go.wait(timeout=60), prefilled(*a))[1]  # after `leaving` is set
        stream = scheduler.stream(["the dog runs quickly and the cat sees it"], max_new_tokens=4)
        leaving.append(stream)  # the first layer of its prefill finds it cancelled
        go.set()
        with pytest.raises(Cancelled, match="stopped at state"):
            list(stream)
        assert not reached  # the last layer never ran for it
    finally:
        first.remove()
        last.remove()
    events = list(scheduler.stream(["a book"], max_new_tokens=2))
    assert events[-1]["event"] == "done" and events[-1]["results"][0]["tokens"] <= 2


def test_a_fault_while_admitting_fails_the_requests_held_and_the_scheduler_goes_on(tmp_path):
    """A fault of the scheduler's own while it admits requests (outside a prefill or a step, which fail their own
    requests) is the answer of the requests it held, and the scheduler thread lives on: it died before, and every
    later generation waited for it forever."""
    base = decoder_backbone("llama")
    side = SideTasks.from_backbone(base, [make_run(tmp_path / "acc", base, "sequence", ["bad", "good"], seed=3)])
    scheduler = Scheduler(side)
    prefilled = scheduler._prefilled

    def faulty(*a):
        scheduler._prefilled = prefilled  # once
        raise RuntimeError("a fault of the scheduler's own")

    scheduler._prefilled = faulty
    answers = []

    def consume(prompts):
        try:
            answers.append(list(scheduler.stream(prompts, max_new_tokens=2)))
        except RuntimeError as e:
            answers.append(e)

    for prompts in (["the dog runs"], ["a book"]):
        t = threading.Thread(target=consume, args=(prompts,))
        t.start()
        t.join(timeout=60)
        assert not t.is_alive(), "the request waits for a scheduler that is gone"
    assert isinstance(answers[0], RuntimeError) and "of the scheduler's own" in str(answers[0])
    assert answers[1][-1]["event"] == "done" and answers[1][-1]["results"][0]["tokens"] <= 2
