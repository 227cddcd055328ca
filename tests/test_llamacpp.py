"""The llama.cpp runtime: states read through llama.cpp's eval callback equal the default runtime's layer hooks.

A tiny Llama-architecture GGUF (F32 weights, tests/tinygguf.py) runs on both runtimes: transformers
(adalayers.model.backbone, through the one GGUF conversion) and llama.cpp (adalayers.infer.llamacpp).
"""
from __future__ import annotations

import os

import numpy as np
import pytest
import torch

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'adalayers[llamacpp]')")

from adalayers.model.backbone import Backbone  # noqa: E402
from adalayers.errors import ModelError  # noqa: E402
from adalayers.infer import llamacpp, llamacpp_states  # noqa: E402
from adalayers.infer.llamacpp import LlamaCpp, Row  # noqa: E402
from adalayers.infer.llamacpp_backbone import LlamaCppBackbone  # noqa: E402
from adalayers.model import gguf_models  # noqa: E402

from tinygguf import write_tiny_llama  # noqa: E402

TEXTS = ["the cat sat on the mat", "a man in the other room", "there"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("gguf")
    path = write_tiny_llama(folder / "tiny-llama.gguf")
    return path


@pytest.fixture(scope="module")
def both(tiny, tmp_path_factory):
    import os

    cache = tmp_path_factory.mktemp("cache")
    old = os.environ.get("ADALAYERS_CACHE")
    os.environ["ADALAYERS_CACHE"] = str(cache)
    try:
        reference = Backbone.load(str(tiny), "decoder")
        ours = LlamaCppBackbone.load(str(tiny), n_ctx=1024, n_seq=8, threads=1)
        yield reference, ours
    finally:
        if old is None:
            os.environ.pop("ADALAYERS_CACHE", None)
        else:
            os.environ["ADALAYERS_CACHE"] = old


def _states(base, batch, stop_after=None):
    seen = {}

    def tap(i, z):
        seen[i] = z.detach().clone()

    out = base(batch, taps=[tap], stop_after=stop_after)
    return seen, out


def test_states_equal_the_layer_hooks(both):
    reference, ours = both
    assert ours.num_layers == reference.num_layers and ours.hidden_size == reference.hidden_size
    batch = reference.tokenize(TEXTS, max_length=64)  # left-padded, BOS first: the same ids for both
    want, ref_out = _states(reference, batch)
    got, out = _states(ours, batch)
    assert sorted(got) == list(range(reference.num_layers))
    mask = batch["attention_mask"].bool()
    for i in range(reference.num_layers):
        a, b = want[i][mask], got[i][mask]
        # F32 weights on both sides; llama.cpp keeps its KV cache in f16 (its default): ~1e-3 relative
        rel = ((a - b).norm(dim=-1) / a.norm(dim=-1)).max()
        assert rel < 5e-3, (i, rel)
        assert (got[i][~mask] == 0).all()  # padding positions: zero
    # next-token logits of each row's last token
    a, b = ref_out.logits[:, -1], out.logits[:, -1]
    assert ((a - b).norm(dim=-1) / a.norm(dim=-1)).max() < 5e-3, (a - b).abs().max()


def test_a_single_row_alone_equals_its_row_in_a_batch(both):
    _, ours = both
    batch = ours.tokenizer(TEXTS, padding=True, return_tensors="pt")
    together, _ = _states(ours, batch)
    alone, _ = _states(ours, ours.tokenizer(TEXTS[2:], return_tensors="pt"))
    n = int(batch["attention_mask"][2].sum())
    for i in together:
        assert torch.allclose(together[i][2, -n:], alone[i][0], atol=1e-5)


def test_early_exit_stops_after_the_deepest_state(both):
    reference, ours = both
    batch = reference.tokenize(TEXTS[:1], max_length=32)
    got, out = _states(ours, batch, stop_after=2)
    assert sorted(got) == [0, 1, 2] and out.logits is None


def test_greedy_ids_with_taps_equal_llama_cpp_alone(both):
    _, ours = both
    engine, prompt = ours.engine, ours.tokenizer("the cat")["input_ids"]

    def greedy(taps):
        seq = engine.acquire(1)
        ids, logits = list(prompt), engine.decode([Row(prompt, seq[0])], taps, outputs="all" if taps else "last")
        for _ in range(8):
            ids.append(int(np.argmax(logits[0])))
            logits = engine.decode([Row([ids[-1]], seq[0], len(ids) - 1)], taps)
        engine.release(seq)
        return ids

    seen = []
    assert greedy([lambda i, z: seen.append(i)]) == greedy([])
    assert seen and max(seen) == ours.num_layers - 1


def _count_entries(monkeypatch) -> list:
    import ctypes

    entered, on_data = [], llamacpp.StateReader.on_data

    def counted(reader, t):
        entered.append(reader.names.index(ctypes.string_at(t + llamacpp_states._NAME_OFFSET)))
        return on_data(reader, t)

    monkeypatch.setattr(llamacpp.StateReader, "on_data", counted)
    return entered


def test_threads_default_to_the_physical_cores_as_llama_server_does(tiny, monkeypatch):
    """Not llama.cpp's own default of 4 threads whatever the machine: one per physical core this process may
    use, or OMP_NUM_THREADS (adalayers.infer.cores.default_threads); threads given are kept."""
    monkeypatch.setattr(llamacpp, "default_threads", lambda: 3)
    engine = LlamaCpp(tiny, n_ctx=128, n_seq=1, read_states=False)
    assert engine.threads == 3
    engine.close()
    engine = LlamaCpp(tiny, n_ctx=128, n_seq=1, threads=1, read_states=False)
    assert engine.threads == 1
    engine.close()


def test_a_pass_reading_the_final_state_runs_again_only_the_last_tokens_whose_logits_are_wanted(tiny, monkeypatch):
    """run() with a tap on the final state: a row whose logits are not wanted (a piece of a longer prompt) gets
    zeros and no second decode of its last token; the wanted row's logits, the states and the cache after the
    pass (the next token's logits) are the full run's."""
    engine = LlamaCpp(tiny, n_ctx=128, n_seq=2, threads=1)
    rows, taps = [Row([1, 5, 7], 0), Row([2, 9, 4, 3], 1)], {}
    decodes = []
    decode = engine.decode
    monkeypatch.setattr(engine, "decode", lambda *a, **kw: decodes.append(a[0]) or decode(*a, **kw))

    def pass_(logits_of):
        engine.release(engine.acquire(engine.free_sequences))
        engine.acquire(0)
        got = {}
        out = engine.run(rows, [lambda i, z: got.setdefault(i, z.copy())], logits_of=logits_of)
        step = engine.run([Row([8], 0, 3), Row([6], 1, 4)])
        return out, got, step

    full, full_states, full_step = pass_(None)
    decodes.clear()
    some, states, step = pass_([1])
    assert [[len(r.tokens) for r in d] for d in decodes] == [[3, 4], [1], [1, 1]]  # row 1's last token alone
    np.testing.assert_allclose(some[1], full[1], atol=1e-5, rtol=0)  # a tail of one row, not two: rounding
    assert not some[0].any()
    np.testing.assert_allclose(step, full_step, atol=1e-5, rtol=0)
    assert all(np.array_equal(states[i], full_states[i]) for i in full_states)
    decodes.clear()
    assert pass_([])[0] is None and [len(d) for d in decodes] == [2, 2]  # no tail decode at all
    engine.close()


def test_only_the_wanted_states_nodes_enter_python(tiny, monkeypatch):
    """A large pass (gather mode off here): llama.cpp asks about every node of the graph; the compiled filter
    answers, and Python's data path runs once per wanted state's node (in layer order), never without taps."""
    monkeypatch.setattr(llamacpp_states, "GATHER_TOKENS", 0)
    engine = LlamaCpp(tiny, n_ctx=128, n_seq=1, threads=1)
    entered = _count_entries(monkeypatch)
    got = []
    engine.decode([Row([1, 5, 7], 0)], [lambda i, z: got.append(i)], outputs="all")
    every = list(range(engine.num_states))
    assert entered == got == every  # the tiny Llama names one node per state (inp_embd, l_out-0..2, result_norm)
    entered.clear()
    engine.decode([Row([9], 0, 3)], [lambda i, z: None])  # a decode step, every state wanted
    assert entered == every
    entered.clear()
    engine.decode([Row([4], 0, 4)], [lambda i, z: None], wanted={2})
    assert entered == [2]
    entered.clear()
    engine.decode([Row([3], 0, 5)], [])  # no taps: the step never enters Python
    assert entered == []
    engine.close()


def test_small_passes_are_gathered_without_python(tiny, monkeypatch):
    """A pass of at most GATHER_TOKENS tokens: the compiled filter copies the wanted nodes into the reader's
    buffer and Python's data path is never entered; the states equal the Python path's, bit for bit, and
    stop_after still ends the graph (no logits)."""
    def run(gather: bool):
        monkeypatch.setattr(llamacpp_states, "GATHER_TOKENS", 64 if gather else 0)
        engine = LlamaCpp(tiny, n_ctx=128, n_seq=2, threads=1)
        got = []
        logits = engine.decode([Row([1, 5, 7], 0), Row([2, 9], 1)], [lambda i, z: got.append((i, z))], outputs="all")
        step = []
        engine.decode([Row([4], 0, 3), Row([8], 1, 2)], [lambda i, z: step.append((i, z))], wanted={0, 2})
        stopped = engine.decode([Row([6], 0, 4)], [lambda i, z: None], wanted={1}, stop_after=1)
        read = engine.decode([Row([3], 1, 3)], wanted={1, 3}, read=True)
        states = {i: z.copy() for i, z in engine.states().items()}
        engine.close()
        return got, logits, step, stopped, read, states

    entered = _count_entries(monkeypatch)
    fast = run(True)
    assert entered == []
    slow = run(False)
    assert entered  # the Python path was entered
    for (i, a), (j, b) in zip(fast[0] + fast[2], slow[0] + slow[2]):
        assert i == j and np.array_equal(a, b)
    assert [i for i, _ in fast[2]] == [0, 2]
    assert np.array_equal(fast[1], slow[1]) and fast[3] is None and slow[3] is None
    assert sorted(fast[5]) == [1, 3] and np.array_equal(fast[4], slow[4])
    assert fast[5][1].shape == (1, 64)


def test_the_heads_kernels_take_llamacpps_openmp_threads_after_a_decode(tiny, monkeypatch):
    """After a decode the calling thread's numba kernels use llama.cpp's threads (its OpenMP team, idle then:
    infer/kernel_threads.py), one where its threads are no OpenMP team; the side thread beside a decode uses one;
    a context that reads no states leaves numba's count alone."""
    import numba

    engine = LlamaCpp(tiny, n_ctx=128, n_seq=1, threads=2)
    engine.decode([Row([1, 5, 7], 0)], wanted={1}, read=True)  # llama-cpp-python's Linux build: GGML_OPENMP on
    assert numba.get_num_threads() == (min(2, numba.config.NUMBA_NUM_THREADS) if engine.openmp else 1)
    assert engine.side_thread().submit(numba.get_num_threads).result() == 1
    monkeypatch.setattr(engine, "openmp", False)
    engine.decode([Row([2], 0, 3)], wanted={1}, read=True)
    assert numba.get_num_threads() == 1
    engine.close()
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    alone = LlamaCpp(tiny, n_ctx=128, n_seq=1, threads=1, read_states=False)
    alone.decode([Row([1, 5], 0)])
    assert numba.get_num_threads() == numba.config.NUMBA_NUM_THREADS
    alone.close()


def test_a_graph_that_does_not_name_its_layers_is_refused(tiny, monkeypatch):
    monkeypatch.setattr(llamacpp.StateNames, "index", lambda self, name: None)  # a graph named otherwise
    engine = LlamaCpp(tiny, n_ctx=128, n_seq=1, threads=1)
    with pytest.raises(ModelError, match=r"did not name the states \[0, 1, 2, 3\] as adalayers expects"):
        engine.decode([Row([1, 2, 3], 0)], [lambda i, z: None])
    engine.close()


def test_without_numba_the_runtime_names_its_extra(tiny, monkeypatch):
    import sys

    import adalayers.infer

    monkeypatch.setitem(sys.modules, "numba", None)  # as if not installed
    monkeypatch.delitem(sys.modules, "adalayers.infer.llamacpp_filter", raising=False)
    monkeypatch.delattr(adalayers.infer, "llamacpp_filter", raising=False)
    with pytest.raises(ModelError, match=r"needs numba .*: pip install 'adalayers\[llamacpp\]'$"):
        LlamaCpp(tiny, n_ctx=128, n_seq=1, threads=1)
    LlamaCpp(tiny, n_ctx=128, n_seq=1, threads=1, read_states=False).close()  # llama.cpp alone needs no filter


def test_a_file_that_is_not_gguf_is_refused(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"not a gguf")
    with pytest.raises(ModelError, match="is not a GGUF file"):
        LlamaCpp(bad)


def _heads(bb):
    from test_generate import _head

    return [_head(bb, "mean", "sequence"), _head(bb, "last", "sequence", "last", 1), _head(bb, "tags", "token", seed=2)]


def test_side_tasks_answer_the_same_on_both_runtimes(both):
    from adalayers.infer.sidetasks import SideTasks

    reference, ours = both
    heads = _heads(reference)
    a = SideTasks(reference, heads).predict(TEXTS)
    b = SideTasks(ours, heads).predict(TEXTS)
    for x, y in zip(a, b):
        assert x["tasks"]["tags"]["tags"] == y["tasks"]["tags"]["tags"]
        for name in ("mean", "last"):
            p, q = (list(r["tasks"][name]["probabilities"].values()) for r in (x, y))
            assert np.allclose(p, q, atol=1e-4), name
        assert x["base"]["next_token"] == y["base"]["next_token"]


def test_generation_reads_heads_as_one_pass_over_prompt_and_answer(both):
    from adalayers.infer.sidetasks import SideTasks

    from test_generate import _one_pass

    reference, ours = both
    side = SideTasks(ours, _heads(reference))
    prompts = ["the cat", "a man in the"]
    out = side.generate(prompts, max_new_tokens=5, steps=True, ignore_eos=True)
    bare = SideTasks(ours, []).generate(prompts, max_new_tokens=5, ignore_eos=True)
    ref = SideTasks(reference, _heads(reference)).generate(prompts, max_new_tokens=5, steps=True, ignore_eos=True)
    tok = ours.tokenizer
    for p, r, r0, rr in zip(prompts, out, bare, ref):
        assert r["token_ids"] == r0["token_ids"] == rr["token_ids"]  # heads change no generated id; same as transformers
        whole = tok(p)["input_ids"] + r["token_ids"]
        for name in ("mean", "last"):
            got = torch.tensor(list(r["tasks"][name]["probabilities"].values()))
            torch.testing.assert_close(got, _one_pass(side, whole, name), atol=1e-5, rtol=1e-5)
            assert len(r["steps"][name]) == 5
        assert r["tasks"]["tags"]["words"] == (p + r["text"]).split()
    held = ours.engine.acquire(ours.engine.n_seq)  # every sequence was given back
    ours.engine.release(held)


def _stream_together(scheduler, requests: list) -> tuple[list[int], list]:
    """Every request streamed by the scheduler from its own thread: the first starts alone, the others once it
    decodes (so they join a running batch, or wait for room). Returns the rows of every decode step and each
    request's events."""
    import threading
    import time

    sizes, step = [], scheduler._step
    scheduler._step = lambda batch: (sizes.append(len(batch.rows)), step(batch))[1]
    got = [None] * len(requests)

    def client(i):
        got[i] = list(scheduler.stream(requests[i][0], **requests[i][1]))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(requests))]
    threads[0].start()
    deadline = time.time() + 30
    while len(sizes) < 2 and time.time() < deadline:  # the first request decodes; the others come
        time.sleep(0.001)
    for t in threads[1:]:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return sizes, got


def test_requests_batched_together_on_llama_cpp_get_what_they_get_alone(both):
    """The one generation loop on llama.cpp's sequences: requests that join a decoding batch and rows that leave it
    early (infer/batching through the runtime's Cache: Sequences.merged / select) answer as each request alone."""
    from adalayers.infer.sidetasks import SideTasks
    from adalayers.serve.scheduler import Scheduler

    from runs_util import assert_json_close

    reference, ours = both
    side = SideTasks(ours, _heads(reference))
    requests = [(["the cat", "a man in the"], dict(max_new_tokens=40, steps=True, ignore_eos=True)),
                (["there"], dict(max_new_tokens=2, tasks=["tags"], ignore_eos=True)),
                (["the other room"], dict(max_new_tokens=4, answer_only=["mean"], ignore_eos=True))]
    scheduler = Scheduler(side, max_rows=ours.engine.n_seq)
    sizes, got = _stream_together(scheduler, requests)
    assert sizes[0] == sizes[-1] == 2 and max(sizes) >= 3  # rows joined, then left before the first one ended
    for (prompts, kw), events in zip(requests, got):
        for mine, alone in zip(events[-1]["results"], side.generate(prompts, **kw)):
            assert mine["token_ids"] == alone["token_ids"]
            assert_json_close(mine, alone, 1e-4)
    held = ours.engine.acquire(ours.engine.n_seq)  # every sequence was given back
    ours.engine.release(held)


def test_generations_stay_within_their_share_of_the_context(both):
    """Scheduler on llama.cpp (LlamaCppBackbone.generation_room): rows beyond the generations' share of the
    sequences wait in the queue until rows leave, and then answer as alone; a request that can never fit
    (too many prompts, or prompt + max_new_tokens beyond the KV tokens) is refused before it is queued."""
    from adalayers.errors import DataError
    from adalayers.infer.sidetasks import SideTasks
    from adalayers.serve.scheduler import Scheduler

    reference, ours = both
    side = SideTasks(ours, _heads(reference))
    rows, tokens = ours.generation_room(side.max_length)
    assert rows == ours.engine.n_seq - ours.engine.n_seq // 2 and 0 < tokens < ours.engine.n_ctx
    scheduler = Scheduler(side, max_rows=ours.engine.n_seq)
    requests = [(["the cat", "a man", "there"][: rows - 1], dict(max_new_tokens=20, ignore_eos=True)),
                (["the other room", "a cat"], dict(max_new_tokens=3, ignore_eos=True))]
    sizes, got = _stream_together(scheduler, requests)
    assert len(requests[0][0]) + len(requests[1][0]) > rows  # both at once would not fit
    assert sizes[0] == len(requests[0][0]) and max(sizes) <= rows and sizes[-1] == len(requests[1][0])
    for (prompts, kw), events in zip(requests, got):
        for mine, alone in zip(events[-1]["results"], side.generate(prompts, **kw)):
            assert mine["token_ids"] == alone["token_ids"]
    with pytest.raises(DataError, match=f"at most {rows} sequences"):
        scheduler.stream(["a"] * (rows + 1), max_new_tokens=2)
    with pytest.raises(DataError, match=f"{tokens} KV tokens"):
        scheduler.stream(["a", "the cat"], max_new_tokens=tokens // 2 + 1)
    held = ours.engine.acquire(ours.engine.n_seq)  # every sequence was given back
    ours.engine.release(held)


def test_a_burst_of_prompts_over_one_batch_is_prefilled_in_groups(both, tiny):
    """Scheduler on llama.cpp with a small n_batch (runtime.prefill_tokens): waiting requests whose prompts
    together exceed one llama_decode are prefilled in groups, one group between two decode steps, and answer as
    each alone; a request whose own prompts exceed it is refused in one line before it is queued."""
    from adalayers.errors import DataError
    from adalayers.infer.llamacpp import LlamaCpp
    from adalayers.infer.sidetasks import SideTasks
    from adalayers.serve.scheduler import Scheduler

    reference, ours = both
    engine = LlamaCpp(tiny, n_ctx=1024, n_seq=8, n_batch=96, threads=1)
    small = LlamaCppBackbone(engine, ours.tokenizer, ours.name, ours.path)
    side = SideTasks(small, _heads(reference))
    assert small.prefill_tokens() == 96
    text = "the cat sat on the mat and a man in the other room"
    prompts = [" ".join([text] * 2), text + " there", " ".join([text] * 2) + " the cat"]
    lengths = [len(i) for i in small.tokenizer(prompts)["input_ids"]]
    assert max(lengths) <= 96 < sum(lengths[1:])  # each fits one decode, the waiting ones together do not
    requests = [(["the cat"], dict(max_new_tokens=30, ignore_eos=True))] + [
        ([p], dict(max_new_tokens=6, ignore_eos=True)) for p in prompts]
    scheduler = Scheduler(side, max_rows=engine.n_seq)
    sizes, got = _stream_together(scheduler, requests)
    grew = [b for a, b in zip(sizes, sizes[1:]) if b > a]
    assert len(grew) >= 2  # the waiting rows joined over several steps
    for (p, kw), events in zip(requests, got):
        assert events[-1]["results"][0]["token_ids"] == side.generate(p, **kw)[0]["token_ids"]
    with pytest.raises(DataError, match="one prefill on this runtime takes at most 96"):
        scheduler.stream(prompts[:2], max_new_tokens=2)
    held = engine.acquire(engine.n_seq)  # every sequence was given back
    engine.release(held)


def _gemma_installed() -> bool:
    from importlib.metadata import PackageNotFoundError, distribution

    from adalayers.model.model_packages import SPLIT_GGUF
    try:
        for dist, _ in SPLIT_GGUF["gemma3-270m"].parts:
            distribution(dist)
    except PackageNotFoundError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.skipif(not _gemma_installed(), reason="gemma3-270m's packages are not installed (pip install 'adalayers[gemma]')")
def test_gemma_states_match_the_default_runtime_within_the_quantization_error(real_base_cache, monkeypatch):
    """gemma3-270m's Q4_K_M file run by llama.cpp against the same file dequantized to fp32 in transformers (the
    conversion is cached in the user's cache after its first use, conftest.real_base_cache): the embedding state equal, every layer's close (the quantization's
    own error, docs/llm.md "States": means 0.6-2.2%, the final norm's 5.4%). Both read the reference tokenizer's
    batch: the llama.cpp side is handed that tokenizer, not reading Gemma's vocabulary again (test_llamacpp_tokenizer)."""
    reference = Backbone.load("gemma3-270m", "decoder")
    monkeypatch.setattr(gguf_models, "tokenizer", lambda path, sha256=None: reference.tokenizer)
    ours = LlamaCppBackbone.load("gemma3-270m", n_ctx=512, n_seq=4, threads=1)
    assert ours.tokenizer is reference.tokenizer
    texts = ["The book was written by John.", "Him and me went to the store yesterday.", "Colorless green ideas sleep."]
    batch = reference.tokenize(texts, max_length=32)
    want, _ = _states(reference, batch)
    got, _ = _states(ours, batch)
    mask = batch["attention_mask"].bool()
    assert ours.num_layers == reference.num_layers == 19 and sorted(got) == list(range(19))
    for i in range(19):
        a, b = want[i][mask], got[i][mask]
        rel = (a - b).norm(dim=-1) / a.norm(dim=-1)
        cos = torch.nn.functional.cosine_similarity(a, b, dim=-1)
        if i == 0:
            assert rel.max() < 1e-4, rel.max()
        else:
            assert rel.mean() < (0.08 if i == 18 else 0.04) and cos.min() > 0.98, (i, rel.mean(), cos.min())
        assert (got[i][~mask] == 0).all()


@pytest.mark.slow
@pytest.mark.skipif(not _gemma_installed(), reason="gemma3-270m's packages are not installed (pip install 'adalayers[gemma]')")
def test_a_prompt_longer_than_gemmas_window_decodes_as_with_the_full_size_cache(real_base_cache):
    """The sliding-window layers' KV cache holds each sequence's window only (swa_full off, llama-server's
    default). A prompt of 900 tokens, past Gemma 3's window of 512, decoded in pieces of 100 (the window's cells
    reused as the sequence moves on) gives the very logits it gives with llama.cpp's full-size cache, and the
    next token of the prompt decoded at once; a sequence's cells dropped before they leave its window would
    change them."""
    got = {}
    for full in (False, True):
        engine = LlamaCpp(llamacpp.gguf_path("gemma3-270m"), n_ctx=2048, n_seq=2, n_batch=1024, threads=2,
                          read_states=False, swa_full=full)
        lib = llamacpp._lib()
        text = " ".join(f"The {i}th visitor of the museum wrote a note about the painting." for i in range(200))
        raw, buf = text.encode(), (lib.llama_token * 4096)()
        n = lib.llama_tokenize(lib.llama_model_get_vocab(engine.model), raw, len(raw), buf, 4096, True, False)
        tokens = list(buf[:n])[:900]
        assert len(tokens) == 900
        whole = engine.decode([Row(tokens, 0)])[0]
        for at in range(0, 900, 100):
            got[full] = engine.decode([Row(tokens[at:at + 100], 1, at)])[0]
        assert got[full].argmax() == whole.argmax()
        del engine
    assert np.array_equal(got[False], got[True])
