"""Sentence pairs from end to end: a head trained on pairs is given pairs by predict, SideTasks and the
service, and a pair head given single texts (or a single-text head given pairs) is refused in one line."""
from __future__ import annotations

import asyncio

import httpx
import pytest
from fastapi.testclient import TestClient

from adalayers import cli
from adalayers.recipes import service
from adalayers.serve.config import ServeConfig
from adalayers.errors import DataError
from adalayers.infer.sidetasks import SideTasks
from adalayers.serve.app import create_app

from conftest import tiny_backbone
from runs_util import make_run, serve_in_thread

PAIRS = [("john sees the dog", "the dog sees john"), ("a good movie", "a bad film"), ("she runs", "she runs")]
SINGLE = ["john sees the big dog", "a good movie"]


@pytest.fixture(scope="module")
def base(tokenizer):
    return tiny_backbone("bert", tokenizer)


@pytest.fixture(scope="module")
def runs(base, tmp_path_factory):
    root = tmp_path_factory.mktemp("pair_runs")
    return {"acc": make_run(root / "acc", base, "sequence", ["bad", "good"], seed=3),
            "para": make_run(root / "para", base, "sequence", ["different", "same"], seed=5, pairs=True),
            "sim": make_run(root / "sim", base, "regression", [], seed=6, pairs=True)}


@pytest.fixture(scope="module")
def side(base, runs):
    return SideTasks.from_backbone(base, [runs["acc"], runs["para"], runs["sim"]])


def test_predict_takes_pairs_and_reads_the_second_text(base, runs):
    a, b = [x for x, _ in PAIRS], [y for _, y in PAIRS]
    got = service.predict(runs["para"], a, backbone=base, text_pairs=b)
    assert [(r["text"], r["text_pair"]) for r in got] == PAIRS
    swapped = service.predict(runs["para"], b, backbone=base, text_pairs=a)
    assert got[0]["probabilities"] != swapped[0]["probabilities"]  # the order of the pair matters: both are read
    values = service.predict(runs["sim"], a, backbone=base, text_pairs=b)
    assert all(isinstance(r["value"], float) for r in values)


def test_predict_refuses_the_wrong_input(base, runs):
    with pytest.raises(DataError, match="trained on sentence pairs: give each text its second text"):
        service.predict(runs["para"], SINGLE, backbone=base)
    with pytest.raises(DataError, match="trained on single texts, not sentence pairs"):
        service.predict(runs["acc"], SINGLE, backbone=base, text_pairs=SINGLE)
    with pytest.raises(DataError, match="2 texts but 1 second texts"):
        service.predict(runs["para"], SINGLE, backbone=base, text_pairs=SINGLE[:1])
    with pytest.raises(DataError, match="second text 2 is empty"):
        service.predict(runs["para"], SINGLE, backbone=base, text_pairs=["fine", " "])


def test_sidetasks_pairs_match_the_training_encoding(side, base, runs):
    a, b = [x for x, _ in PAIRS], [y for _, y in PAIRS]
    served = side.predict(a, text_pairs=b)
    assert [set(r["tasks"]) for r in served] == [{"para", "sim"}] * 3   # by default: the heads that take pairs
    direct = service.predict(runs["para"], a, backbone=base, text_pairs=b)
    for s, d in zip(served, direct):
        assert s["text_pair"] == d["text_pair"] and s["truncated"] is False
        assert s["tasks"]["para"]["probabilities"]["same"] == pytest.approx(d["probabilities"]["same"], abs=1e-5)
    singles = side.predict(SINGLE)
    assert [set(r["tasks"]) for r in singles] == [{"acc"}] * 2 and "text_pair" not in singles[0]


def test_sidetasks_refuses_the_wrong_input(side):
    with pytest.raises(DataError, match="task 'para' was trained on sentence pairs"):
        side.predict(SINGLE, tasks=["para"])
    with pytest.raises(DataError, match="task 'acc' was trained on single texts"):
        side.predict(SINGLE, tasks=["acc"], text_pairs=SINGLE)


def test_a_long_pair_is_truncated_as_in_training(side):
    long = " ".join(["the big dog"] * 40)
    (r,) = side.predict([long], tasks=["para"], text_pairs=["a dog"])
    assert r["truncated"] is True


def test_cli_predict_pair_and_pair_file(runs, base, tmp_path, capsys, monkeypatch):
    import adalayers.model.backbone as backbone_mod

    monkeypatch.setattr(backbone_mod.Backbone, "load", classmethod(lambda cls, *a, **k: base))
    assert cli.main(["predict", str(runs["para"]), "--pair", *PAIRS[0], "--pair", *PAIRS[1]]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].endswith("\tjohn sees the dog\tthe dog sees john")
    f = tmp_path / "pairs.tsv"
    f.write_text("".join(f"{x}\t{y}\n" for x, y in PAIRS), encoding="utf-8")
    assert cli.main(["predict", str(runs["para"]), "--file", str(f), "--json"]) == 0
    assert capsys.readouterr().out.count('"text_pair"') == 3
    f.write_text("john sees the dog\tthe dog sees john\na good movie\n", encoding="utf-8")
    assert cli.main(["predict", str(runs["para"]), "--file", str(f)]) == 2
    assert "line 2 has no TAB" in capsys.readouterr().err
    f.write_text("a good movie\twith a tab inside\n", encoding="utf-8")  # a single-text head: the line is one text
    assert cli.main(["predict", str(runs["acc"]), "--file", str(f), "--json"]) == 0
    assert '"text": "a good movie\\twith a tab inside"' in capsys.readouterr().out
    assert cli.main(["predict", str(runs["para"]), "john sees the dog"]) == 2
    assert "trained on sentence pairs" in capsys.readouterr().err
    assert cli.main(["predict", str(runs["acc"]), "--pair", "a", "b"]) == 2
    assert "trained on single texts" in capsys.readouterr().err


@pytest.fixture(scope="module")
def client(side):
    with TestClient(create_app(side, ServeConfig(max_texts=4, max_chars=60, max_wait_ms=1))) as c:
        yield c


def test_service_takes_pairs_as_lists_or_text_pairs(client, side):
    a, b = [x for x, _ in PAIRS], [y for _, y in PAIRS]
    as_lists = client.post("/predict", json={"texts": [list(p) for p in PAIRS], "base": False})
    as_field = client.post("/predict", json={"texts": a, "text_pairs": b, "tasks": ["para"]})
    assert as_lists.status_code == 200 and as_field.status_code == 200, (as_lists.text, as_field.text)
    direct = side.predict(a, tasks=["para"], text_pairs=b)
    for got, other, ref in zip(as_lists.json()["results"], as_field.json()["results"], direct):
        assert set(got["tasks"]) == {"para", "sim"} and got["text_pair"] == ref["text_pair"]
        for g in (got, other):
            assert g["tasks"]["para"]["probabilities"]["same"] == pytest.approx(
                ref["tasks"]["para"]["probabilities"]["same"], abs=1e-5)
    singles = client.post("/predict", json={"texts": SINGLE})
    assert singles.status_code == 200 and set(singles.json()["results"][0]["tasks"]) == {"acc"}
    assert client.get("/tasks").json()["tasks"][1]["pairs"] is True


@pytest.mark.parametrize("body, says", [
    ({"texts": SINGLE, "tasks": ["para"]}, "task 'para' was trained on sentence pairs"),
    ({"texts": [["a good movie", "a bad film"]], "tasks": ["acc"]}, "task 'acc' was trained on single texts"),
    ({"texts": ["a good movie", ["a", "b"]]}, "mixes single texts and [text, second] pairs"),
    ({"texts": [["a", "b", "c"]]}, "text 1 is a list of 3 texts"),
    ({"texts": ["a", "b"], "text_pairs": ["c"]}, "2 texts but 1 text_pairs"),
    ({"texts": [["a good movie", " "]]}, "second text 1 is empty"),
])
def test_service_refuses_the_wrong_input(client, body, says):
    r = client.post("/predict", json=body)
    assert r.status_code == 422 and says in r.text, r.text


def test_pairs_and_singles_batched_together_over_real_http(side):
    with serve_in_thread(create_app(side, ServeConfig(max_batch=64, max_wait_ms=300)), log_level="warning") as url:
        bodies = [{"texts": [list(p)]} for p in PAIRS] + [{"texts": [t]} for t in SINGLE]

        async def clients():
            async with httpx.AsyncClient(base_url=url, timeout=30) as c:
                return await asyncio.gather(*[c.post("/predict", json=b) for b in bodies])

        answers = asyncio.run(clients())
        assert [a.status_code for a in answers] == [200] * len(bodies)
        pair_ref = side.predict([x for x, _ in PAIRS], text_pairs=[y for _, y in PAIRS])
        single_ref = side.predict(SINGLE)
        for a, ref in zip(answers, pair_ref + single_ref):
            (got,) = a.json()["results"]
            assert got["text"] == ref["text"] and set(got["tasks"]) == set(ref["tasks"])
            for name, out in ref["tasks"].items():
                if "value" in out:
                    assert got["tasks"][name]["value"] == pytest.approx(out["value"], abs=1e-5)
                else:
                    assert got["tasks"][name]["label"] == out["label"]


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_a_decoders_pair_is_one_text_joined_by_a_newline_from_training_to_serving(kind, tmp_path):
    """On a decoder (Llama's tokenizer puts BOS before each text of a pair; Qwen's nothing between them) the pair
    head reads `text + "\\n" + text_pair` as one text: SideTasks counts and predicts exactly that, the answer
    carries the caller's two texts, and a pair template is still the user's to choose."""
    from adalayers.data.templates import Template
    from tinydecoders import decoder_backbone

    base = decoder_backbone(kind)
    run = make_run(tmp_path / "para", base, "sequence", ["different", "same"], seed=5, pairs=True)
    side = SideTasks.from_backbone(base, [run])
    a, b = [p[0] for p in PAIRS], [p[1] for p in PAIRS]
    tok = base.tokenizer
    joined = [len(tok(x + "\n" + y)["input_ids"]) for x, y in PAIRS]
    assert side.count_tokens(a, None, b) == joined
    if kind == "llama":  # its pair encoding would have put a second BOS between the texts
        assert [len(ids) for ids in tok(a, b)["input_ids"]] == [n + 1 for n in joined]
    served = side.predict(a, text_pairs=b)
    assert [(r["text"], r["text_pair"]) for r in served] == PAIRS
    direct = service.predict(run, a, backbone=base, text_pairs=b)
    assert [r["probabilities"] for r in direct] == pytest.approx([r["tasks"]["para"]["probabilities"] for r in served])
    assert Template(pair_separator=None).apply(tok, a, b) == (a, b)  # task.pair_separator: null keeps the encoding
