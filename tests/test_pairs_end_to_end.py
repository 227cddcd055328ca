"""A sentence-pair task from a plain file to every prediction path: `adalayers train --data --text-pair`,
then `predict --pair`, `predict-files --text-pair-column` and the service, with a head that learned the
task (its label sits in the second text only), all giving the same answers."""
from __future__ import annotations

import json
import random

import pyarrow.parquet as pq
from fastapi.testclient import TestClient

from adalayers import cli
from adalayers.serve.config import ServeConfig
from adalayers.infer.sidetasks import SideTasks
from adalayers.serve.app import create_app

from test_files_task import FILLER, sentence, tiny_base  # noqa: F401  (tiny_base: a fixture)


def pair_rows(n: int, seed: int) -> list[tuple[str, str, str, str]]:
    """(id, question, answer, label): 'match' when the answer holds 'yes', 'mismatch' when it holds 'no'."""
    rng = random.Random(seed)
    return [(f"q{i:04d}", sentence(rng, "plot"), sentence(rng, "yes" if i % 2 == 0 else "no"),
             "match" if i % 2 == 0 else "mismatch") for i in range(n)]


def write_tsv(path, rows) -> None:
    path.write_text("id\tquestion\tanswer\tlabel\n" + "".join("\t".join(r) + "\n" for r in rows), encoding="utf-8")


def test_a_pair_task_from_file_to_predict_bulk_and_service(tiny_base, tmp_path, capsys):  # noqa: F811
    write_tsv(tmp_path / "train.tsv", pair_rows(300, seed=1))
    unseen = pair_rows(24, seed=2)
    write_tsv(tmp_path / "new.tsv", unseen)
    run = tmp_path / "runs" / "qa"
    assert cli.main(["train", "--data", str(tmp_path / "train.tsv"), "--text", "question", "--text-pair", "answer",
                     "--label", "label", "--out", str(run), "--set", f"model.base={tiny_base}", "--set", "mixer.k=16",
                     "--set", "head.num_heads=2", "--set", "head.dim_feedforward=32", "--set", "train.lr=0.01",
                     "--set", "train.max_epochs=5", "--set", "train.num_threads=1", "--set", "cache.enabled=false",
                     "--set", "train.device=cpu"]) == 0
    capsys.readouterr()
    truth = [label for *_, label in unseen]

    args = ["predict", str(run)]
    for _, q, a, _ in unseen:
        args += ["--pair", q, a]
    assert cli.main(args) == 0
    predicted = [line.split("\t")[0] for line in capsys.readouterr().out.strip().splitlines()]
    assert sum(p == t for p, t in zip(predicted, truth)) >= 20  # it learned: the label is read from the second text

    out = tmp_path / "out"
    assert cli.main(["predict-files", "--base", tiny_base, "--heads", str(run), "--input", str(tmp_path / "new.tsv"),
                     "--text-column", "question", "--text-pair-column", "answer", "--output", str(out)]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 24
    table = pq.read_table(out)
    assert table.column("id").to_pylist() == [i for i, *_ in unseen]
    assert table.column("qa_label").to_pylist() == predicted

    side = SideTasks.load(tiny_base, [str(run)], primary=False, device="cpu")
    with TestClient(create_app(side, ServeConfig(max_wait_ms=1))) as client:
        answer = client.post("/predict", json={"texts": [[q, a] for _, q, a, _ in unseen]})
        single = client.post("/predict", json={"texts": ["a question alone"]})
    assert answer.status_code == 200
    assert [r["tasks"]["qa"]["label"] for r in answer.json()["results"]] == predicted
    assert single.status_code == 422 and "no loaded head takes single texts (heads: qa (sentence pairs))" in single.text
