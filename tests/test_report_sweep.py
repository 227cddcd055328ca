"""`adalayers report` and `adalayers sweep-layers` on tiny runs of a random 2-layer BERT."""
import json
import logging
from pathlib import Path

import pytest

from adalayers import cli, config
from adalayers.recipes import service
from adalayers.lab import report, sweep
from adalayers.errors import RunError

from tinymodels import conll_files, imdb_tarball, tiny_bert, tiny_config

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("world")
    model = tiny_bert(root / "model")
    imdb_tarball(root / "data", per_class=12, test_per_class=6)
    conll_files(root / "data", copies=3)
    return model, root / "data"


@pytest.fixture(autouse=True)
def _no_env(monkeypatch):
    monkeypatch.delenv("ADALAYERS_DATA", raising=False)


def _is_png(path: Path) -> bool:
    return path.is_file() and path.read_bytes()[:8] == PNG and path.stat().st_size > 2000


def test_report_on_a_classification_run(world, tmp_path):
    model, data = world
    run = tmp_path / "imdb"
    metrics = service.train(tiny_config(model, data, "imdb", model={"max_length": 12}, train={"keep": "head"}), run)
    assert cli.main(["report", str(run), "--top", "3"]) == 0
    md = (run / "report.md").read_text(encoding="utf-8")
    rep = json.loads((run / "report.json").read_text(encoding="utf-8"))
    for name in ("layer_weights", "layer_history", "training_curves", "confusion_matrix"):
        assert _is_png(run / rep["figures"][name]), name
        assert f"]({rep['figures'][name]})" in md
    # the head run again gives what training measured on the same split
    assert rep["scores"]["accuracy"] == pytest.approx(metrics["test"]["accuracy"])
    cm = rep["scores"]["confusion_matrix"]
    assert sum(map(sum, cm)) == 12 and [sum(r) for r in cm] == [6, 6]
    assert rep["layer_weights"] == pytest.approx(metrics["layer_weights"])
    # every review is longer than 12 tokens: all are truncated, and the report says so
    assert rep["truncation"]["test"] == {"examples": 12, "truncated": 12, "fraction": 1.0}
    assert "test 12 of 12 (100.0%)" in md
    wrong = rep["most_confident_wrong"]
    assert len(wrong) == min(3, round(12 * (1 - metrics["test"]["accuracy"])))
    assert all(w["predicted"] != w["true"] for w in wrong)
    assert [w["confidence"] for w in wrong] == sorted((w["confidence"] for w in wrong), reverse=True)
    assert all(w["text"][:40] in md for w in wrong)
    assert "| layer | 0 | 1 | 2 |" in md and "## Confusion matrix" in md


def test_report_on_a_token_run(world, tmp_path):
    model, data = world
    run = tmp_path / "conll"
    metrics = service.train(tiny_config(model, data, "conll2003", model={"max_length": 8},
                                        train={"max_epochs": 3}), run)
    rep = report.build(run, top=5)
    md = (run / "report.md").read_text(encoding="utf-8")
    assert _is_png(run / rep["figures"]["per_class"])
    assert rep["scores"]["f1"] == pytest.approx(metrics["test"]["f1"])
    assert set(rep["scores"]["per_class"]) == {"LOC", "MISC", "ORG", "PER"}
    for name, v in rep["scores"]["per_class"].items():
        assert f"| {name} | {v['precision']:.4f} | {v['recall']:.4f} | {v['f1']:.4f} | {v['support']:,} |" in md
    # max_length 8 splits the longer sentences into windows, and the report counts them
    assert rep["truncation"]["test"]["split_into_windows"] > 0
    assert rep["truncation"]["test"]["windows"] > rep["truncation"]["test"]["examples"]
    for w in rep["most_confident_wrong"]:
        assert w["predicted"] != w["true"] and f"[{w['word']}]" in w["sentence"]


def test_sweep_pins_each_layer_and_resumes(world, tmp_path, monkeypatch):
    model, data = world
    out = tmp_path / "sweep"
    cfg = tiny_config(model, data, "imdb", train={"max_epochs": 1})
    r = sweep.run_sweep(cfg, out, layers="0,2")
    assert [e["pin_layer"] for e in r["layers"]] == [0, 2] and r["adalayers"]["pin_layer"] is None
    for e in r["layers"]:
        weights = json.loads((out / f"layer_{e['pin_layer']}" / "metrics.json").read_text())["layer_weights"]
        assert weights == [1.0 if i == e["pin_layer"] else 0.0 for i in range(3)]
        assert e["used_layers"] == [e["pin_layer"]]
        assert e["params_used"] == e["trainable_params"] - 2 * 16 * 32  # two unused projections (k=16, d=32)
    assert r["best_layer"] in (0, 2) and r["last_layer"] == 2
    assert _is_png(out / "sweep.png")
    table = (out / "sweep.md").read_text(encoding="utf-8")
    assert table.count("| layer ") == 2 and "**AdaLayers**" in table
    assert "Only layers 0, 2 were swept" in table  # the best single layer is the best of those two
    assert json.loads((out / "sweep.json").read_text()) == r

    # a second sweep reuses the finished runs and only trains the new layer
    trained = []
    real_train = service.train
    monkeypatch.setattr(service, "train", lambda c, o, **kw: trained.append(Path(o).name) or real_train(c, o, **kw))
    assert cli.main(["sweep-layers", "x.yaml", "--out", str(out), "--layers", "0,1,2"]) == 2  # no such config
    r2 = sweep.run_sweep(cfg, out, layers="0,1,2")
    assert trained == ["layer_1"] and [e["pin_layer"] for e in r2["layers"]] == [0, 1, 2]
    assert "were swept" not in (out / "sweep.md").read_text(encoding="utf-8")  # every layer of the base
    assert r2["layers"][0]["test"] == r["layers"][0]["test"]
    one = {**r2, "layers": r2["layers"][2:], "best_layer": 2, "best_layer_on_test": 2}
    assert "Only layer 2 was swept" in sweep._table(one)  # a sweep of one layer says so

    # changed settings must not be mixed with the finished runs
    other = tiny_config(model, data, "imdb", train={"max_epochs": 1, "lr": 1e-2})
    with pytest.raises(RunError, match=r"train\.lr"):
        sweep.run_sweep(other, out, layers="0")


def test_sweep_reuses_a_given_adalayers_run(world, tmp_path):
    model, data = world
    cfg = tiny_config(model, data, "imdb", train={"max_epochs": 1})
    ada, probe_kept = tmp_path / "ada", tmp_path / "probe_kept"
    service.train(config.from_dict(cfg.to_dict(), ["train.keep=probe"]), probe_kept)
    with pytest.raises(RunError, match="kept its linear probe"):  # the sweep compares heads
        sweep.run_sweep(cfg, tmp_path / "s0", layers="1", adalayers_run=probe_kept)
    service.train(config.from_dict(cfg.to_dict(), ["train.keep=head"]), ada)
    r = sweep.run_sweep(cfg, tmp_path / "sweep", layers="1", adalayers_run=ada)
    assert r["adalayers"]["run"] == str(ada) and not (tmp_path / "sweep" / "adalayers").exists()
    assert r["adalayers"]["differences"] == []
    r = sweep.run_sweep(tiny_config(model, data, "imdb", train={"max_epochs": 1, "lr": 1e-2}), tmp_path / "s3",
                        layers="1", adalayers_run=ada)
    assert r["adalayers"]["differences"] == ["train.lr: 0.003 there, 0.01 now"]
    assert "train.lr: 0.003 there, 0.01 now" in (tmp_path / "s3" / "sweep.md").read_text()
    with pytest.raises(RunError, match="max_length"):
        sweep.run_sweep(tiny_config(model, data, "imdb", model={"max_length": 16}), tmp_path / "s2",
                        layers="1", adalayers_run=ada)


def test_sweep_takes_a_folder_of_seeds_as_its_adalayers_run(world, tmp_path):
    """`sweep-layers --seeds 2 --adalayers DIR` where DIR is from `train --seeds 2`: medians with min-max."""
    from adalayers.lab import seeds

    model, data = world
    cfg = tiny_config(model, data, "imdb", train={"max_epochs": 1, "keep": "head"})
    summary = seeds.train_seeds(cfg, tmp_path / "ada", 2)
    r = sweep.run_sweep(cfg, tmp_path / "sweep", layers="1", adalayers_run=tmp_path / "ada", seeds=2)
    assert r["adalayers"]["differences"] == [] and r["adalayers"]["test_main"] == summary["test"]["accuracy"]
    assert r["adalayers"]["spread"]["test"]["values"] == summary["spread"]["test"]["accuracy"]["values"]
    assert "**AdaLayers**" in (tmp_path / "sweep" / "sweep.md").read_text(encoding="utf-8")


def test_a_sweep_split_into_parts_trains_each_layer_once(world, tmp_path, monkeypatch, capsys):
    """--no-table parts train only their layers; the last call over every layer reuses them and adds AdaLayers."""
    model, data = world
    cfg = tiny_config(model, data, "imdb", train={"max_epochs": 1})
    out, trained = tmp_path / "sweep", []
    real_train = service.train
    monkeypatch.setattr(service, "train", lambda c, o, **kw: trained.append(Path(o).name) or real_train(c, o, **kw))
    part = sweep.run_sweep(cfg, out, layers="0,2", table=False)
    assert [e["pin_layer"] for e in part["layers"]] == [0, 2] and "adalayers" not in part
    sweep.run_sweep(cfg, out, layers="1", table=False)
    assert trained == ["layer_0", "layer_2", "layer_1"]
    assert not (out / "adalayers").exists() and not (out / "sweep.json").exists()
    whole = sweep.run_sweep(cfg, out)
    assert trained[3:] == ["adalayers"] and [e["pin_layer"] for e in whole["layers"]] == [0, 1, 2]
    assert (out / "sweep.md").read_text(encoding="utf-8").count("| layer ") == 3
    assert cli.main(["sweep-layers", "x.yaml", "--out", str(out), "--no-table", "--adalayers", str(out)]) == 2
    assert "a --no-table part trains no AdaLayers run" in capsys.readouterr().err


def test_time_limit_stops_between_epochs_and_still_tests(world, tmp_path, capsys, caplog):
    caplog.set_level(logging.INFO, logger="adalayers")  # the engine says why it stopped through logging
    model, data = world
    # 0.6 ms: the first epoch always runs, and any epoch takes longer than what is left after it
    cfg = tiny_config(model, data, "imdb", train={"max_epochs": 4, "max_minutes": 1e-5})
    metrics = service.train(cfg, tmp_path / "run")
    log = (tmp_path / "run" / "log.jsonl").read_text(encoding="utf-8").splitlines()
    assert len(log) == 1 and metrics["epochs"] == 1 and "accuracy" in metrics["test"]
    out = capsys.readouterr()
    assert "another epoch would end past train.max_minutes" in out.out + out.err + caplog.text


def test_report_on_a_regression_run(world, tmp_path):
    model, _ = world
    words = ["good", "bad", "fine", "awful", "great", "poor", "nice", "grim"]
    for split, n in (("train", 40), ("validation", 12), ("test", 12)):
        rows = [f"{' '.join(words[(i + j) % 8] for j in range(1 + i % 5))},{(i % 5) / 2}" for i in range(n)]
        (tmp_path / f"{split}.csv").write_text("text,label\n" + "\n".join(rows) + "\n", encoding="utf-8")
    from adalayers import config

    cfg = config.from_dict(tiny_config(model, tmp_path, "cola").to_dict(),
                           ["task.name=files", "task.kind=regression", "head.kind=regression",
                            *[f"task.{split}={tmp_path / split}.csv" for split in ("train", "validation", "test")]])
    run = tmp_path / "run"
    metrics = service.train(cfg, run)
    rep = report.build(run, "test", top=4)
    md = (run / "report.md").read_text(encoding="utf-8")
    assert rep["scores"]["pearson"] == pytest.approx(metrics["test"]["pearson"])
    assert _is_png(run / rep["figures"]["predictions"]) and "## The 4 largest errors" in md
    errors = [w["error"] for w in rep["most_confident_wrong"]]
    assert len(errors) == 4 and errors == sorted(errors, reverse=True)
    assert f"| test pearson | {rep['scores']['pearson']:.4f} |" in md
