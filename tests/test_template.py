"""task.template: one wrapping of the input text for training, the cache key, predict, serve, predict-files and
generate, on a tiny Llama whose tokenizer has a chat template (set here) and prepends BOS."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest
import torch

from adalayers.recipes import service
from adalayers.model.backbone import Backbone
from adalayers.bulk.predictor import BatchPredictor
from adalayers.config import from_dict
from adalayers.errors import ConfigError, DataError, ModelError
from adalayers.infer.sidetasks import SideTasks
from adalayers.data.templates import Template
from bulk_util import sentences
from runs_util import make_run
from tinydecoders import decoder_model, decoder_tokenizer

# roles as words of the tiny vocabulary; the template writes BOS itself, as Gemma's does
CHAT = ("{{ bos_token }}{% for m in messages %}they love {{ m['content'] }} .{% endfor %}"
        "{% if add_generation_prompt %} it is{% endif %}")
TEXTS = ["the dog runs quickly", "she loves the big movie", "a book"]


def chat_tokenizer(bos: bool = True):
    tok = decoder_tokenizer(bos)
    tok.chat_template = CHAT
    return tok


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("tiny-llama-chat")
    tok = chat_tokenizer()
    decoder_model("llama", len(tok)).save_pretrained(folder)
    tok.save_pretrained(folder)
    return str(folder)


def test_the_config_checks_the_template():
    assert from_dict({"task": {"template": "chat"}}).task.template == "chat"
    assert from_dict({"task": {"template": "Review: {text}\nSentiment:"}}).task.add_generation_prompt is True
    for spec, problem in [("Review: {review}", r"unknown field \{review\}"), ("no field", "must be 'chat' or hold"),
                          ("{text", "not a valid format string"), ("{0} {text}", r"unknown field \{0\}")]:
        with pytest.raises(ConfigError, match=f"task.template: {problem}"):
            from_dict({"task": {"template": spec}})


def test_format_strings_and_pairs():
    tok = decoder_tokenizer(False)
    assert Template("Review: {text} ! {{x}}").apply(tok, ["a {b}"]) == (["Review: a {b} ! {x}"], None)
    pair = Template("Q1: {text} Q2: {text_pair}")
    assert pair.apply(tok, ["a", "b"], ["c", "d"]) == (["Q1: a Q2: c", "Q1: b Q2: d"], None)
    # off: a decoder's pair is one text joined by task.pair_separator (no second BOS between the texts)
    assert Template().apply(tok, ["a", "b"], ["c", "d"]) == (["a\nc", "b\nd"], None)
    assert Template(pair_separator=" | ").apply(tok, ["a"], ["c"]) == (["a | c"], None)
    assert Template(pair_separator=None).apply(tok, ["a"], ["b"]) == (["a"], ["b"])  # the tokenizer's encoding
    assert Template().apply(tok, ["a"]) == (["a"], None)
    with pytest.raises(DataError, match="takes sentence pairs, got single texts"):
        pair.apply(tok, ["a"])
    with pytest.raises(DataError, match="takes single texts, got sentence pairs"):
        Template("{text}").apply(tok, ["a"], ["b"])


def test_an_encoders_pair_keeps_its_own_pair_encoding_and_a_decoders_reads_one_text():
    from transformers import AutoTokenizer

    from adalayers.data.templates import joins_pairs
    from adalayers.model import model_packages

    bert = AutoTokenizer.from_pretrained(str(model_packages.path_for("minilm-l6")))
    assert not joins_pairs(bert) and Template().apply(bert, ["a"], ["b"]) == (["a"], ["b"])
    for bos in (True, False):
        tok = decoder_tokenizer(bos)
        assert joins_pairs(tok)
        ids = tok(*Template().apply(tok, ["the dog"], ["a book"]))["input_ids"][0]
        assert ids.count(tok.bos_token_id) == (1 if bos else 0)  # the tokenizer's pair encoding: two with bos
        assert tok.convert_ids_to_tokens(ids)[-4:] == ["the", "dog", "a", "book"]


@pytest.mark.parametrize("bos", [True, False])
def test_chat_wraps_as_apply_chat_template_does(bos):
    """The wrapped text tokenizes to apply_chat_template's ids: one BOS, never two."""
    tok = chat_tokenizer(bos)
    for gen in (True, False):
        (wrapped,), _ = Template("chat", gen).apply(tok, ["the dog"])
        ids = tok.apply_chat_template([{"role": "user", "content": "the dog"}], add_generation_prompt=gen)
        assert tok(wrapped)["input_ids"] == ids["input_ids"]
        assert wrapped.endswith(" it is") == gen


def test_what_cannot_take_a_template_is_refused_in_one_line():
    plain = decoder_tokenizer(True)  # no chat template
    with pytest.raises(ModelError, match="tokenizer of tiny has no chat template; give a format string") as e:
        Template("chat").check(plain, "tiny", False, "classification")
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="token tasks take no template"):
        Template("{text}").check(plain, "tiny", False, "token")
    with pytest.raises(ConfigError, match="chat wraps one text"):
        Template("chat").check(chat_tokenizer(), "tiny", True, "classification")
    with pytest.raises(ConfigError, match=r"needs \{text_pair\}"):
        Template("{text}").check(plain, "tiny", True, "classification")
    with pytest.raises(ConfigError, match=r"\{text_pair\} is for sentence-pair tasks"):
        Template("{text} {text_pair}").check(plain, "tiny", False, "regression")


def _one_pass(side: SideTasks, name: str, text: str) -> torch.Tensor:
    """The head's probabilities on `text` exactly as given (no template), one plain forward."""
    task, tok = side.heads[name].task, side.backbone.tokenizer
    ids = tok(text)["input_ids"]
    batch = {"input_ids": torch.tensor([ids]), "attention_mask": torch.ones(1, len(ids), dtype=torch.long)}
    with torch.no_grad():
        task.begin()
        side.backbone(batch, taps=[task.tap])
        return torch.softmax(task.end(batch["attention_mask"]), -1)[0]


def _probs(r: dict, name: str) -> torch.Tensor:
    return torch.tensor(list(r["tasks"][name]["probabilities"].values()))


def _train(base: str, tmp_path: Path, out: str, **task) -> tuple[Path, Path]:
    data = tmp_path / "data.csv"
    if not data.exists():
        with open(data, "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f)
            w.writerow(["text", "label"])
            w.writerows((t, "good" if i % 2 else "bad") for i, t in enumerate(sentences(40, seed=5)))
    cfg = from_dict({"task": {"train": str(data), **task}, "model": {"base": base, "max_length": 32},
                     "mixer": {"k": 8}, "head": {"num_heads": 2, "dim_feedforward": 16, "pooling": "last"},
                     "train": {"max_epochs": 1, "batch_size": 8, "num_threads": 1},
                     "cache": {"dir": str(tmp_path / "cache")}})
    service.train(cfg, tmp_path / out)
    return tmp_path / out, tmp_path / "cache" / "states"


def _entries(states: Path) -> set[str]:
    return {p.parent.name for p in states.glob("*/manifest.json")}


def test_one_wrapping_for_training_cache_predict_serve_files_and_generate(base, tmp_path):
    run, states = _train(base, tmp_path, "chat", template="chat")
    first = _entries(states)
    assert len(first) == 2  # train + validation, built from the wrapped texts
    # the same template reuses them; another template (or none) never does
    _train(base, tmp_path, "chat_again", template="chat")
    assert _entries(states) == first
    _train(base, tmp_path, "chat_nogen", template="chat", add_generation_prompt=False)
    _train(base, tmp_path, "plain")
    assert len(_entries(states)) == 6

    side = SideTasks.load(base, [str(run)])
    wrapped, _ = Template("chat").apply(side.backbone.tokenizer, TEXTS)
    served = side.predict(TEXTS)
    cli = service.predict(run, TEXTS)
    files = BatchPredictor(base, [str(run)]).predict([str(i) for i in range(len(TEXTS))], TEXTS).to_pylist()
    gen = side.generate(TEXTS, max_new_tokens=3)
    model, tok = side.backbone.model, side.backbone.tokenizer
    for i, text in enumerate(TEXTS):
        one = _one_pass(side, "chat", wrapped[i])  # what the head read in training
        assert served[i]["text"] == text and gen[i]["prompt"] == text  # answers show the caller's text
        torch.testing.assert_close(_probs(served[i], "chat"), one, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(torch.tensor(list(cli[i]["probabilities"].values())), one, atol=1e-5, rtol=1e-5)
        assert files[i]["chat_score"] == pytest.approx(float(one.max()), abs=1e-5)
        # generation continues the wrapped prompt, and the prefill's prediction is the same one
        torch.testing.assert_close(torch.tensor(list(gen[i]["prompt_tasks"]["chat"]["probabilities"].values())),
                                   one, atol=1e-5, rtol=1e-5)
        ids = tok(wrapped[i])["input_ids"]
        ref = model.generate(torch.tensor([ids]), max_new_tokens=3, do_sample=False,
                             pad_token_id=tok.pad_token_id)[0, len(ids):].tolist()
        assert gen[i]["token_ids"] == ref[: len(gen[i]["token_ids"])]
    # the template mattered: the raw texts give other predictions
    assert not torch.allclose(_one_pass(side, "chat", TEXTS[0]), _probs(served[0], "chat"), atol=1e-4)

    # heads wrapping differently cannot share one pass
    with pytest.raises(ModelError, match="different task.template settings .*serve them separately"):
        SideTasks.load(base, [str(run), str(tmp_path / "plain")])


def test_a_pair_template_makes_one_text(base, tmp_path):
    bb = Backbone.load(base)
    run = make_run(tmp_path / "pairs", bb, "sequence", ["no", "yes"], seed=1, pairs=True,
                   template="Q1: {text} Q2: {text_pair} same ?")
    side = SideTasks.from_backbone(bb, [str(run)])
    firsts, seconds = ["the dog", "a book"], ["a cat", "the film"]
    served = side.predict(firsts, text_pairs=seconds)
    cli = service.predict(run, firsts, backbone=bb, text_pairs=seconds)
    for i in range(2):
        one = _one_pass(side, "pairs", f"Q1: {firsts[i]} Q2: {seconds[i]} same ?")
        assert served[i]["text_pair"] == seconds[i]
        torch.testing.assert_close(_probs(served[i], "pairs"), one, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(torch.tensor(list(cli[i]["probabilities"].values())), one, atol=1e-5, rtol=1e-5)
    assert side.count_tokens(firsts, text_pairs=seconds) == [len(bb.tokenizer(f"Q1: {a} Q2: {b} same ?")["input_ids"])
                                                           for a, b in zip(firsts, seconds)]
    with pytest.raises(DataError, match="no loaded head takes single texts"):
        side.predict(firsts)


def test_the_pair_and_bos_probes_tokenize_once_per_tokenizer_not_once_per_request():
    from adalayers.data.templates import joins_pairs, prepends_bos

    tok = decoder_tokenizer(True)
    calls = []
    real = type(tok).__call__

    class Counting(type(tok)):
        def __call__(self, *args, **kwargs):
            calls.append(args)
            return real(self, *args, **kwargs)

    tok.__class__ = Counting
    assert joins_pairs(tok) and prepends_bos(tok)  # probed now (or by an earlier test: the same object)
    first = len(calls)
    assert first <= 2
    for _ in range(5):
        assert joins_pairs(tok) and prepends_bos(tok)
        assert Template().apply(tok, ["a"], ["b"]) == (["a\nb"], None)
    assert len(calls) == first  # remembered, never asked again
    assert joins_pairs(decoder_tokenizer(False)) and not prepends_bos(decoder_tokenizer(False))
