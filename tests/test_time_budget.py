"""Time before training (adalayers.recipes.budget): the cache is built before the first epoch, its estimated
time said first; train.time_budget (--time-budget) lowers max_length when the base's pass would not fit and
gives the head what is left as train.max_minutes, both said (a random 2-layer BERT)."""
import json
import logging

import numpy as np
import yaml

from adalayers import cli
from adalayers.recipes import service
from adalayers.recipes import budget

from tinymodels import imdb_tarball, tiny_bert, tiny_config


def test_length_for_is_the_largest_cut_that_fits():
    lengths = np.array([10, 20, 30, 100])
    assert budget.length_for(lengths, 160) == 100  # everything whole
    assert budget.length_for(lengths, 90) == 30   # 10 + 20 + 30 + 30
    assert budget.length_for(lengths, 89) == 29
    assert budget.length_for(lengths, 1) == 8     # never below 8


def test_the_cache_is_built_before_the_first_epoch_with_its_time_said(tmp_path, caplog, monkeypatch):
    model = tiny_bert(tmp_path / "model")
    imdb_tarball(tmp_path / "data", per_class=12, test_per_class=6)
    monkeypatch.setenv("ADALAYERS_CACHE", str(tmp_path / "cache"))
    cfg = tiny_config(model, tmp_path / "data", "imdb", cache={"enabled": True, "dir": str(tmp_path / "cache")},
                      train={"max_epochs": 1, "keep": "head"})
    with caplog.at_level(logging.INFO, logger="adalayers"):
        service.train(cfg, tmp_path / "run")
    lines = [r.getMessage() for r in caplog.records]
    building = next(i for i, m in enumerate(lines) if m.startswith("cache: building train, validation, test"))
    built = next(i for i, m in enumerate(lines) if m.startswith("cache: built in"))
    first = next(i for i, m in enumerate(lines) if m.startswith("epoch   1/1"))
    assert building < built < first and "tokens/s" in lines[building]
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="adalayers"):  # a second run finds every entry: nothing said
        service.train(cfg, tmp_path / "run2")
    assert not [r for r in caplog.records if r.getMessage().startswith("cache: building")]


def test_a_time_budget_lowers_max_length_and_sets_the_heads_minutes(tmp_path, caplog, monkeypatch):
    model = tiny_bert(tmp_path / "model")
    imdb_tarball(tmp_path / "data", per_class=12, test_per_class=6)
    monkeypatch.setattr(budget, "pass_rate", lambda *a, **k: 0.1)  # a slow base: 10 tokens a second
    out, path = tmp_path / "run", tmp_path / "imdb.yaml"
    path.write_text(yaml.safe_dump(tiny_config(model, tmp_path / "data", "imdb", train={"max_epochs": 1}).to_dict()))
    args = ["train", str(path), "--out", str(out), "--time-budget", "1"]
    with caplog.at_level(logging.INFO, logger="adalayers"):
        assert cli.main(args) == 0
    used = json.loads((out / "config.json").read_text())["config"]
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("time budget 1m00s")]
    assert len(said) == 2 and "model.max_length" in said[0] and "(not 24)" in said[0]
    assert 8 <= used["model"]["max_length"] < 24 and used["train"]["time_budget"] == 1
    # 60 s, less at most 30 s for the base's pass and 6 s kept for the probes: the head gets the floor of 1 minute
    assert used["train"]["max_minutes"] == 1.0 and "train.max_minutes=1" in said[1]
