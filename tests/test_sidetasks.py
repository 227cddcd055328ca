"""SideTasks: many heads on one base pass give what each head gives alone, and leave the base untouched."""
import pytest
import torch

from adalayers.data.encoding import encode
from adalayers.errors import DataError, ModelError
from adalayers.recipes.evaluate import example_predictions, row_outputs
from adalayers.infer.outputs import tag_words
from adalayers.infer.sidetasks import SideTasks
from adalayers.model.states import LiveStates
from adalayers.data.tasks import Example

from conftest import tiny_backbone, tiny_model
from runs_util import NER, make_run

LONG = " ".join(["john sees the big dog and mary loves the good movie ,"] * 4) + " they hate it !"
TEXTS = ["the book was written by john .", "john sees the big dog", "a good movie",
         "she loves the terrible film and he hates it !", LONG, "mary  runs\tquickly", "xyzzy plugh quux ?"]


@pytest.fixture(scope="module")
def base(tokenizer):
    return tiny_backbone("bert", tokenizer)


@pytest.fixture(scope="module")
def runs(base, tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    return {"acc": make_run(root / "acc", base, "sequence", ["bad", "good", "meh"], seed=3, p=[1, 1, 0, 0],
                            max_length=16),
            "score": make_run(root / "score", base, "regression", [], seed=2, p=[0, 1, 1, 0], max_length=16),
            "ner": make_run(root / "ner", base, "token", NER, seed=4, p=[1, 0, 1, 0], max_length=16)}


@pytest.fixture(scope="module")
def side(base, runs):
    return SideTasks.from_backbone(base, list(runs.values()))


def alone(base, run_dir, texts):
    """The head by itself through the training code path (encode -> LiveStates -> row_outputs)."""
    from adalayers.store import run as runlib

    task, cfg, _ = runlib.load_head(run_dir, base)
    if task.kind == "token":
        examples = [Example(words=t.split()) for t in texts]
    else:
        examples = [Example(text=t) for t in texts]
    split = encode(examples, base.tokenizer, cfg.model.max_length, task.kind, task.labels)
    outs = row_outputs(task, LiveStates(base), split, batch_size=4, pad_id=0)
    if task.kind != "token":
        return outs
    scores = [[None] * len(e.words) for e in examples]
    for row, probs in zip(split.rows, outs):
        seen = set()
        for pos, w in enumerate(row["word_ids"]):
            if w is not None and w not in seen:
                seen.add(w)
                scores[row["example"]][row["word_start"] + w] = float(probs[pos].max())
    return example_predictions(task, split, outs, examples), scores


def test_combined_pass_matches_each_head_alone(side, base, runs):
    combined = side.predict(TEXTS)
    assert combined[4]["truncated"] and not combined[0]["truncated"]
    for name, run_dir in runs.items():
        ref = alone(base, run_dir, TEXTS)
        subset = side.predict(TEXTS, tasks=[name])
        for i, r in enumerate(combined):
            got, only = r["tasks"][name], subset[i]["tasks"][name]
            if name == "score":
                assert got["value"] == pytest.approx(ref[i], abs=1e-5)
                assert got["value"] == pytest.approx(only["value"], abs=1e-5)
            elif name == "acc":
                probs = [got["probabilities"][k] for k in ["bad", "good", "meh"]]
                assert probs == pytest.approx(ref[i].tolist(), abs=1e-5)
                assert got["label"] == ["bad", "good", "meh"][int(ref[i].argmax())] == only["label"]
            else:
                tags, scores = ref
                assert got["words"] == TEXTS[i].split()
                assert got["tags"] == tags[i] == only["tags"]
                # the fused GEMM sums in another order: on this project's AVX512-BF16 machines a token
                # score moves by up to 6e-5 through the token head (the tags above stay equal)
                assert got["scores"] == pytest.approx(scores[i], abs=2e-4)


def test_predictions_are_not_trivial(side):
    """Guards the comparison above: the random heads must disagree across texts, or equality proves little."""
    out = side.predict(TEXTS)
    assert len({r["tasks"]["acc"]["label"] for r in out}) > 1
    assert len({round(r["tasks"]["score"]["value"], 4) for r in out}) == len(TEXTS)
    assert len({t for r in out for t in r["tasks"]["ner"]["tags"]}) > 1


def test_base_output_bit_identical_with_heads_attached(base, side):
    no_heads = SideTasks(base, [])
    with_heads = side.predict(TEXTS[:4])
    plain = no_heads.predict(TEXTS[:4])
    direct = base(base.tokenize(TEXTS[:4], max_length=side.max_length)).pooled
    for j, (a, b) in enumerate(zip(with_heads, plain)):
        assert a["base"]["embedding"] == b["base"]["embedding"]
        assert torch.equal(torch.tensor(a["base"]["embedding"]), direct[j])


def test_early_exit_same_predictions_and_stops_at_deepest_layer(base, runs, side):
    fast = SideTasks.from_backbone(base, list(runs.values()), primary=False)
    ran = []
    hooks = [layer.register_forward_hook(lambda m, a, o, i=i: ran.append(i)) for i, layer in
             enumerate(base.layers, start=1)]
    try:
        early = fast.predict(TEXTS, tasks=["acc"])  # acc uses layers 0-1 only
    finally:
        for h in hooks:
            h.remove()
    assert set(ran) == {1}
    full = side.predict(TEXTS, tasks=["acc"])
    for e, f in zip(early, full):
        assert "base" not in e
        assert [e["tasks"]["acc"]["probabilities"][k] for k in ("bad", "good", "meh")] == pytest.approx(
            [f["tasks"]["acc"]["probabilities"][k] for k in ("bad", "good", "meh")], abs=1e-5)
    both = fast.predict(TEXTS)
    every = side.predict(TEXTS)
    for e, f in zip(both, every):
        assert e["tasks"]["score"]["value"] == pytest.approx(f["tasks"]["score"]["value"], abs=1e-5)
        assert e["tasks"]["ner"]["tags"] == f["tasks"]["ner"]["tags"]


def test_head_from_another_base_is_refused(tokenizer, runs):
    other = tiny_backbone("bert", tokenizer)
    with torch.no_grad():
        other.model.embeddings.word_embeddings.weight[5, 0] += 1.0  # one weight differs
    with pytest.raises(ModelError, match="fingerprint"):
        SideTasks.from_backbone(other, [runs["acc"]])


def test_load_from_a_model_folder(tmp_path, tokenizer, base, runs):
    model = tiny_model("bert", len(tokenizer))
    model.save_pretrained(tmp_path / "base")
    tokenizer.save_pretrained(tmp_path / "base")
    side = SideTasks.load(str(tmp_path / "base"), [f"quality={runs['acc']}", runs["ner"]], device="cpu")
    assert side.names == ["quality", "ner"]
    assert side.backbone.fingerprint() == base.fingerprint()
    assert set(side.predict(["a good movie"])[0]["tasks"]) == {"quality", "ner"}


def test_bad_requests_fail_clearly(side, base, runs):
    with pytest.raises(DataError, match="known: acc, score, ner"):
        side.predict(["a good movie"], tasks=["sentiment"])
    with pytest.raises(DataError, match="text 2 is empty"):
        side.predict(["a good movie", "  "])
    with pytest.raises(ModelError, match="NAME=RUN"):
        SideTasks.from_backbone(base, [runs["acc"], f"acc={runs['ner']}"])


def test_entity_spans_from_iob2_tags():
    text = "John  Smith lives in New York ."
    spans = [(0, 4), (6, 11), (12, 17), (18, 20), (21, 24), (25, 29), (30, 31)]
    tags = ["B-PER", "I-PER", "O", "O", "B-LOC", "I-LOC", "O"]
    word_ids = [None] + list(range(7)) + [None]
    probs = torch.zeros(9, len(NER))
    for pos, t in enumerate(tags, start=1):
        probs[pos, NER.index(t)] = 1.0
    out = tag_words(NER, text, spans, [(word_ids, probs)])
    assert out["tags"] == tags
    assert out["entities"] == [{"type": "PER", "text": "John  Smith", "start": 0, "end": 11, "words": [0, 2]},
                               {"type": "LOC", "text": "New York", "start": 21, "end": 29, "words": [4, 6]}]


def test_small_passes_equal_the_batched_pass(side, monkeypatch):
    """A pass of at most SMALL_PASS token positions runs every layer's projections after the base (FusedTap's
    defer, adalayers.model.fused.all_layers): one text at a time gives the answers of the batched pass."""
    from adalayers.model import fused

    held = []
    real = fused.all_layers
    monkeypatch.setattr(fused, "all_layers", lambda z, *a: held.append(z.shape) or real(z, *a))
    combined = side.predict(TEXTS)
    assert held == []  # the batch of every text is over SMALL_PASS positions: tapped layer by layer
    for i, text in enumerate(TEXTS[:4]):
        one = side.predict([text])[0]["tasks"]
        got = combined[i]["tasks"]
        assert one["score"]["value"] == pytest.approx(got["score"]["value"], abs=1e-5)
        assert [one["acc"]["probabilities"][k] for k in ("bad", "good", "meh")] == pytest.approx(
            [got["acc"]["probabilities"][k] for k in ("bad", "good", "meh")], abs=1e-5)
        assert one["ner"]["tags"] == got["ner"]["tags"]
        assert one["ner"]["scores"] == pytest.approx(got["ner"]["scores"], abs=2e-4)
    assert held  # the single texts' passes ran all layers at once


def test_a_pass_whose_texts_are_abandoned_while_it_runs_stops_at_the_next_layer(base, runs):
    """`abandoned` is asked before every micro-batch and, on an interruptible runtime, before every layer: a
    micro-batch whose texts all lose their clients while it runs ends at the next layer (the later layers never
    run), its texts are skipped, and the other micro-batches are answered as without it."""
    side = SideTasks.from_backbone(base, [runs["acc"]], batch_size=2)
    want = side.predict(TEXTS[:4], ["acc"])
    asks: list[int] = []  # per forward (micro-batch): the layers it asked about before running them
    forward = side.runtime.forward

    def counting(batch, heads, stop, cancelled=None):
        asks.append(0)

        def asked():
            asks[-1] += 1
            return cancelled()
        return forward(batch, heads, stop, asked)

    side.runtime.forward = counting
    gone: set[int] = set()

    def abandoned() -> set[int]:
        if asks == [2]:  # the first micro-batch (texts 0 and 1), before its second layer: both clients leave
            gone.update({0, 1})
        return gone
    skipped = side.rows_skipped
    got = side.predict(TEXTS[:4], ["acc"], abandoned=abandoned)
    assert got[:2] == [None, None] and got[2:] == want[2:]
    assert side.rows_skipped == skipped + 2
    assert asks[0] == 2 and asks[1] > 2  # the first stopped at its second layer; the second ran them all


def test_counting_tokens_does_not_wait_for_the_pass_tokenizer(side):
    """count_tokens (serve's checks thread) reads its own copy of the tokenizer: while a pass holds the shared
    tokenizer's lock, a new request's tokens are still counted, and the counts are the same."""
    import threading

    want = side.count_tokens(TEXTS, ["ner"])
    held, release = threading.Event(), threading.Event()

    def pass_tokenizing():
        with side.backbone.tokenizer.lock:
            held.set()
            release.wait(30)
    t = threading.Thread(target=pass_tokenizing)
    t.start()
    try:
        assert held.wait(10)
        got: list = []
        counter = threading.Thread(target=lambda: got.append(side.count_tokens(TEXTS, ["ner"])))
        counter.start()
        counter.join(10)
        assert got == [want], "the count waited for the pass's tokenizer lock"
    finally:
        release.set()
        t.join(10)
