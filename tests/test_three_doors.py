"""One front door: `adalayers predict RUN TEXT --json`, SideTasks.predict and POST /predict (the real service
under uvicorn in a subprocess) give the same JSON for the same text, for every head kind: classes, binary,
regression, tokens and sentence pairs (tiny random heads on a tiny random BERT)."""
from __future__ import annotations

import json

import httpx
import pytest
import torch

from adalayers import cli
from adalayers.infer.sidetasks import SideTasks
from adalayers.model.backbone import Backbone

from runs_util import NER, ServeProcess, assert_json_close, make_run
from tinymodels import tiny_bert

SENT = "john sees the big dog and mary loves the good movie ,"
TEXTS = ["John  lives in Paris .", " ".join([SENT] * 4) + " they hate it !"]  # the second: truncated, windows
SECOND = ["he lives there", "a short second text"]
KINDS = {"classes": ("sequence", ["bad", "meh", "good"], False), "binary": ("sequence", ["no", "yes"], False),
         "regression": ("regression", [], False), "tokens": ("token", NER, False),
         "pairs": ("sequence", ["different", "same"], True)}


@pytest.fixture(scope="module")
def doors(tmp_path_factory):
    root = tmp_path_factory.mktemp("doors")
    base_dir = tiny_bert(root / "tiny-bert")
    base = Backbone.load(str(base_dir))
    runs = {name: make_run(root / name, base, kind, labels, seed=i, pairs=pairs)
            for i, (name, (kind, labels, pairs)) in enumerate(KINDS.items())}
    server = ServeProcess(base_dir, list(runs.values()), root)
    try:
        yield runs, SideTasks.from_backbone(base, list(runs.values())), server.wait_started()
    finally:
        server.stop()


def _cli(run, texts, pairs, capsys) -> list[dict]:
    args = [a for t, s in zip(texts, pairs) for a in ("--pair", t, s)] if pairs else list(texts)
    torch.set_num_threads(1)  # as the service (--threads 1)
    assert cli.main(["predict", str(run), *args, "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def _flat(result: dict, name: str) -> dict:
    """A SideTasks / service result for one head, as the CLI prints it: the text's fields, then the answer."""
    return {**{k: v for k, v in result.items() if k not in ("base", "tasks")}, **result["tasks"][name]}


@pytest.mark.parametrize("name", list(KINDS))
def test_cli_sidetasks_and_service_give_the_same_json(doors, name, capsys):
    runs, side, server = doors
    pairs = SECOND if KINDS[name][2] else None
    cli_out = _cli(runs[name], TEXTS, pairs, capsys)
    lib = [_flat(r, name) for r in side.predict(TEXTS, [name], text_pairs=pairs)]
    body = {"texts": [[t, s] for t, s in zip(TEXTS, pairs)] if pairs else TEXTS, "tasks": [name]}
    r = httpx.post(f"{server.url}/predict", json=body, timeout=60)
    assert r.status_code == 200, r.text
    http = [_flat(x, name) for x in r.json()["results"]]
    assert [x["truncated"] for x in lib] == [False, True]
    for i in range(len(TEXTS)):
        assert_json_close(cli_out[i], lib[i], 1e-5, f"{name} text {i} cli/lib")
        assert_json_close(http[i], lib[i], 1e-5, f"{name} text {i} http/lib")
    answer = lib[0]
    expected = {"classes": {"label", "probabilities"}, "binary": {"label", "probabilities"}, "regression": {"value"},
                "tokens": {"words", "tags", "scores", "entities"}, "pairs": {"label", "probabilities"}}[name]
    assert set(answer) == {"text", "truncated"} | expected | ({"text_pair"} if pairs else set())
    if name == "tokens":  # every word of the long text is tagged (its windows), in the one richer schema
        assert answer["words"] == TEXTS[0].split() and lib[1]["words"] == TEXTS[1].split()
        assert None not in lib[1]["scores"]
