"""The torch-free serving path (infer/gguf_serving.py) in this process, against the torch path on the same states.

The tiny F32 GGUF and its two heads (runs_util.tiny_gguf_runs): GgufPredictor (llama.cpp's tokenizer, numpy heads)
and SideTasks on the llama.cpp runtime (transformers' tokenizer, torch heads) give the same answers on /predict's
path, in generation (prompt, per-step and final values, the text) and in embeddings; passes cut into many small
llama_decodes (decode_rows: a row longer than a decode split at its positions) give the same numbers as one.
Values within 1e-3: llama.cpp's numbers for one sequence move by ~5e-5 with the other rows of its batch, and
the two paths batch rows differently (same labels, tags and tokens throughout).
"""
from __future__ import annotations

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'adalayers[llamacpp]')")

from runs_util import assert_json_close, tiny_gguf_runs  # noqa: E402

TOL = 1e-3

TEXTS = ["the cat sat on the", "a man in the other room", "there", "the other cat sat in a room on the man"]


@pytest.fixture(scope="module")
def sides(tmp_path_factory):
    from adalayers.infer.gguf_serving import GgufPredictor
    from adalayers.infer.sidetasks import SideTasks

    with tiny_gguf_runs(tmp_path_factory.mktemp("gguf_serving")) as runs:
        heads = [f"acc={runs['acc']}", f"ner={runs['ner']}"]
        yield SideTasks.load(str(runs["base"]), heads, runtime="llama.cpp"), GgufPredictor.load(str(runs["base"]), heads)


def test_predict_equals_the_torch_path(sides):
    torch_side, numpy_side = sides
    assert_json_close(torch_side.predict(TEXTS), numpy_side.predict(TEXTS), TOL)
    assert torch_side.count_tokens(TEXTS, ["ner"]) == numpy_side.count_tokens(TEXTS, ["ner"])
    assert torch_side.describe() == numpy_side.describe()


def test_generation_equals_the_torch_path(sides):
    torch_side, numpy_side = sides
    kw = dict(max_new_tokens=6, steps=True, ignore_eos=True)
    a, b = torch_side.generate(TEXTS[:3], **kw), numpy_side.generate(TEXTS[:3], **kw)
    assert [r["token_ids"] for r in a] == [r["token_ids"] for r in b]
    assert_json_close(a, b, TOL)
    alone = dict(kw, answer_only=["acc"])  # the answer alone: the full read over the generated tokens
    assert_json_close(torch_side.generate(TEXTS[:2], **alone), numpy_side.generate(TEXTS[:2], **alone), TOL)


@pytest.mark.parametrize("asked", [dict(steps=True), dict(), dict(guard={"acc": ("good", 1.0)}), dict(tasks=["acc"])])
def test_heads_not_read_at_a_step_mixed_many_steps_at_once_equal_the_torch_path(sides, monkeypatch, asked):
    """gguf_steps.LATER_ROWS: a head not read at a step (ner, a token head read at the end; acc too without
    steps or a guard) has its decode steps' states kept and mixed many rows at once; with 8 rows a mix (every
    third step of 3 rows, the rest at the final read) the answers are still the torch path's."""
    from adalayers.infer import gguf_steps

    torch_side, numpy_side = sides
    monkeypatch.setattr(gguf_steps, "LATER_ROWS", 8)
    kw = dict(max_new_tokens=7, ignore_eos=True, **asked)
    a, b = torch_side.generate(TEXTS[:3], **kw), numpy_side.generate(TEXTS[:3], **kw)
    assert [r["token_ids"] for r in a] == [r["token_ids"] for r in b] and len(b[0]["token_ids"]) == 7
    assert asked.get("tasks") == ["acc"] or all(len(r["tasks"]["ner"]["words"]) for r in b)
    assert_json_close(a, b, TOL)


def test_a_guard_stops_the_same_row_at_the_same_token(sides):
    torch_side, numpy_side = sides
    kw = dict(max_new_tokens=8, ignore_eos=True, guard={"acc": ("good", 0.5)})
    a, b = torch_side.generate(TEXTS[:2], **kw), numpy_side.generate(TEXTS[:2], **kw)
    assert [(r["finish"], r.get("guard", {}).get("token")) for r in a] == \
        [(r["finish"], r.get("guard", {}).get("token")) for r in b]


def test_embeddings_equal_the_torch_path(sides):
    torch_side, numpy_side = sides
    for pooling in ("mean", "last"):
        assert_json_close(torch_side.embed(TEXTS, pooling), numpy_side.embed(TEXTS, pooling), TOL)


def test_passes_cut_into_small_decodes_give_the_same_numbers(sides, monkeypatch):
    """3 tokens a llama_decode (rows cut mid-way), against whole passes: the same answers and generations."""
    from adalayers.infer import gguf_steps

    _, numpy_side = sides
    whole = numpy_side.predict(TEXTS), numpy_side.generate(TEXTS[:2], max_new_tokens=4, steps=True),\
        numpy_side.embed(TEXTS)
    monkeypatch.setattr(gguf_steps, "OUTPUTS_AT_ONCE", 3)
    cut = numpy_side.predict(TEXTS), numpy_side.generate(TEXTS[:2], max_new_tokens=4, steps=True),\
        numpy_side.embed(TEXTS)
    assert_json_close(list(whole), list(cut), 5e-3)  # labels, tags and tokens equal; llama.cpp's numbers move a
    # little more with the cut (attention over the f16 KV cache of earlier decodes): 2.4e-3 here at most
    assert numpy_side.runtime.engine.free_sequences == numpy_side.runtime.engine.n_seq  # every sequence back


@pytest.mark.parametrize("later_rows", [64, 3])
def test_a_long_prompt_is_prefilled_in_chunks_while_running_rows_step(sides, monkeypatch, later_rows):
    """serve's scheduler on the torch-free path: a prompt longer than a chunk (prefill_chunk, serve's --batch-size:
    here 8 tokens, in llama_decodes of 8) is prefilled in pieces with a decode step of the rows already generating
    after each chunk, and both requests answer as each alone. With later_rows 3 the kept states of the heads not
    read at a step are mixed every few steps, across the batches joined and the row that leaves first."""
    import threading
    import time

    from adalayers.infer import gguf_steps
    from adalayers.serve.scheduler import Scheduler

    _, side = sides
    monkeypatch.setattr(gguf_steps, "LATER_ROWS", later_rows)
    monkeypatch.setattr(side.runtime.engine, "n_batch", 8)  # the prefill's llama_decodes: 8 tokens each
    scheduler = Scheduler(side, max_rows=4, prefill_chunk=8)  # serve's --batch-size 8
    inside, during = [False], []
    prefill, step = scheduler.loop.prefill, scheduler._step

    def watched(jobs, between=None):
        inside[0] = True
        try:
            return prefill(jobs, between)
        finally:
            inside[0] = False

    queued = threading.Event()  # the long request is queued: the first one's third step waits for it

    def stepping(batch):
        if len(during) == 2:
            queued.wait(30)
        during.append(inside[0])
        return step(batch)

    scheduler.loop.prefill, scheduler._step = watched, stepping
    long = " ".join(TEXTS * 3)
    assert len(side.backbone.tokenizer([long])["input_ids"][0]) > 4 * 8
    # the second request reads acc at every step: the first row's kept states are mixed when it joins
    requests = [(["the cat"], dict(max_new_tokens=40, ignore_eos=True)), ([long], dict(max_new_tokens=4, steps=True))]
    got = [None, None]

    def client(i):
        events = scheduler.stream(requests[i][0], **requests[i][1])
        if i == 1:
            queued.set()
        got[i] = list(events)

    first = threading.Thread(target=client, args=(0,))
    first.start()
    deadline = time.time() + 30
    while len(during) < 2 and time.time() < deadline:  # the first request decodes
        time.sleep(0.001)
    second = threading.Thread(target=client, args=(1,))
    second.start()
    for t in (first, second):
        t.join(timeout=60)
    assert sum(during) >= 3  # the running row stepped between the long prompt's chunks
    for (prompts, kw), events in zip(requests, got):
        alone = side.generate(prompts, **kw)
        assert events[-1]["results"][0]["token_ids"] == alone[0]["token_ids"]
        assert_json_close(events[-1]["results"], alone, 5e-3)
    assert side.runtime.engine.free_sequences == side.runtime.engine.n_seq  # every sequence back


def test_heads_beside_the_decode_give_the_values_of_heads_after_it(sides, monkeypatch):
    """LlamaCpp.beside: a step's mix and its sequence-head reads run on the thread beside llama_decode, once
    the deepest state is copied, and a prefill's states are mixed there as they come; answers, per-step values,
    guards and tokens are those of the heads run in llama.cpp's own thread, to the bit (the same arithmetic on
    the same states)."""
    import threading

    from adalayers.infer import layer_mix, numpy_incremental

    _, numpy_side = sides
    engine = numpy_side.runtime.engine
    kw = dict(max_new_tokens=6, steps=True, ignore_eos=True)
    guarded = dict(max_new_tokens=8, ignore_eos=True, guard={"acc": ("good", 0.5)})
    monkeypatch.setattr(engine, "overlap", False)
    after = numpy_side.generate(TEXTS[:3], **kw), numpy_side.generate(TEXTS[:2], **guarded)
    threads, added = [], []
    step = numpy_incremental.IncrementalReads.step
    monkeypatch.setattr(numpy_incremental.IncrementalReads, "step",
                        lambda self, *a: threads.append(threading.current_thread().name) or step(self, *a))
    add = layer_mix.LayerMix.add  # the prefill's states, mixed as llama.cpp computes the next layers
    monkeypatch.setattr(layer_mix.LayerMix, "add",
                        lambda self, *a: added.append(threading.current_thread().name) or add(self, *a))
    monkeypatch.setattr(engine, "overlap", True)
    beside = numpy_side.generate(TEXTS[:3], **kw), numpy_side.generate(TEXTS[:2], **guarded)
    assert [r["token_ids"] for r in after[0]] == [r["token_ids"] for r in beside[0]]
    assert [(r["finish"], r.get("guard", {}).get("token")) for r in after[1]] == \
        [(r["finish"], r.get("guard", {}).get("token")) for r in beside[1]]
    assert list(after) == list(beside)
    assert any(t.startswith("llamacpp-beside") for t in threads)  # the step reads ran beside the decode
    assert added and all(t.startswith("llamacpp-beside") for t in added)


def test_heads_go_beside_the_decode_only_where_llamacpp_leaves_a_core_free(sides, monkeypatch):
    """LlamaCpp.beside's rule (overlap unset): with a core free, every decode; with every core used by llama.cpp's
    threads, none (measured to lose there, one row or eight); set, as set."""
    _, numpy_side = sides
    engine = numpy_side.runtime.engine
    monkeypatch.setattr(engine, "overlap", None)
    monkeypatch.setattr(engine, "threads", 2)
    monkeypatch.setattr(engine, "cores", 4)
    assert engine.beside()
    monkeypatch.setattr(engine, "cores", 2)
    assert not engine.beside()
    monkeypatch.setattr(engine, "overlap", True)
    assert engine.beside()
    monkeypatch.setattr(engine, "overlap", False)
    monkeypatch.setattr(engine, "cores", 4)
    assert not engine.beside()


def test_a_state_the_decode_never_reaches_is_none_beside_it_and_errors_come_back(sides):
    """decode's `during`: state(i) for a state past the graph's early end is None (no wait past the decode);
    the states it gives equal what the gather holds after the decode; an error raised beside is raised by decode."""
    from adalayers.infer.llamacpp import Row

    _, numpy_side = sides
    engine = numpy_side.runtime.engine
    tokens = numpy_side.runtime.tokenizer(["the cat sat"])["input_ids"][0]
    seq = engine.acquire(1)
    seen = {}

    def during(state):
        for i in (0, 1, 2):
            z = state(i)
            seen[i] = None if z is None else z.copy()

    try:
        engine.decode([Row(tokens, seq[0])], (), {0, 1, 2}, stop_after=1, read=True, during=during)
        assert seen[2] is None
        for i in (0, 1):
            assert (seen[i] == engine.states()[i]).all()

        def fails(state):
            state(0)
            raise ValueError("beside the decode")

        engine.truncate({seq[0]: 0})
        with pytest.raises(ValueError, match="beside the decode"):
            engine.decode([Row(tokens, seq[0])], (), {0, 1}, read=True, during=fails)
    finally:
        engine.release(seq)


def test_rows_that_leave_take_their_kept_states_with_them():
    """SequenceBatch.keep: the decode steps' states kept for the heads not read at them (LATER_ROWS) keep only the
    rows that stay, in their steps' order; merge puts another batch's after them."""
    import numpy as np

    from adalayers.infer.gguf_steps import SequenceBatch

    class Seqs:
        def select(self, idx):
            return self

        def merged(self, other, at):
            return self

    z = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)  # (layers, rows, d)
    batch = SequenceBatch([None] * 3, Seqs(), [7, 8, 9], [5, 5, 5], [{}, {}, {}], np.zeros((3, 2)),
                          later=[([7, 8, 9], z), ([7, 8, 9], z + 100)])
    kept = batch.keep([0, 2])
    assert kept.gone == [8] and [keys for keys, _ in kept.later] == [[7, 9], [7, 9]]
    np.testing.assert_array_equal(kept.later[0][1], z[:, [0, 2]])
    np.testing.assert_array_equal(kept.later[1][1], z[:, [0, 2]] + 100)
    assert kept.keep([1]).later[0][0] == [9]
    assert [keys for keys, _ in kept.merge(batch.keep([1])).later] == [[7, 9], [7, 9], [8], [8]]
