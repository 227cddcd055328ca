"""`adalayers compare --data` (your own file, as with train), and the frozen-base strategies (scalar mix,
concat) reading the hidden-state cache: the base runs once per cached row, not once per epoch."""
from __future__ import annotations

import json
import math

import pytest
import torch

from adalayers import cli, config
from adalayers.recipes import service
from adalayers.lab import strategies
from adalayers.model.backbone import Backbone

from test_files_task import sentiment_rows, tiny_base, write_csv  # noqa: F401  (tiny_base: a fixture)

EPOCHS = 3


@pytest.fixture()
def count_base_calls(monkeypatch):
    calls = []
    original = Backbone.__call__

    def counted(self, batch, *a, **k):
        calls.append(int(batch["input_ids"].shape[0]))
        return original(self, batch, *a, **k)

    monkeypatch.setattr(Backbone, "__call__", counted)
    return calls


def _cfg(base: str, train, test, cache: bool, tmp_path):
    return config.from_dict({
        "task": {"train": str(train), "test": str(test)}, "model": {"base": base, "max_length": 24},
        "head": {"num_heads": 2}, "cache": {"enabled": cache, "dir": str(tmp_path / "cache")},
        "train": {"max_epochs": EPOCHS, "early_stopping": EPOCHS, "batch_size": 16, "eval_batch_size": 32,
                  "num_threads": 1, "device": "cpu", "lr": 1e-3}})


@pytest.mark.parametrize("spec", ["scalar-mix", "concat"])
def test_frozen_base_strategies_read_the_cache(spec, tiny_base, tmp_path, count_base_calls):  # noqa: F811
    train = write_csv(tmp_path / "train.csv", sentiment_rows(96, 1), ["text", "label"])
    test = write_csv(tmp_path / "test.csv", sentiment_rows(32, 2), ["text", "label"])
    results = {}
    for cache in (True, False):
        cfg = _cfg(tiny_base, train, test, cache, tmp_path)
        backbone, data, encoded = service.prepare(cfg)
        count_base_calls.clear()
        torch.manual_seed(0)
        trained = strategies.make(spec, []).train(cfg, backbone, data, encoded, tmp_path / f"{spec}-{cache}")
        results[cache] = (list(count_base_calls), trained)
    rows = {name: len(split.rows) for name, split in encoded.items()}
    build = sum(math.ceil(n / 32) for n in rows.values())       # one pass over each split, to fill the cache
    cached_calls, cached = results[True]
    assert len(cached_calls) == build and sum(cached_calls) == sum(rows.values())
    live_calls, live = results[False]
    per_epoch = math.ceil(rows["train"] / 16) + math.ceil(rows["validation"] / 32)
    assert len(live_calls) == EPOCHS * per_epoch + math.ceil(rows["validation"] / 32) + math.ceil(rows["test"] / 32)
    assert cached.epochs == live.epochs == EPOCHS
    # fp16 cache against the live fp32 states: the same task learned to about the same quality
    assert abs(cached.results["test"]["accuracy"] - live.results["test"]["accuracy"]) <= 0.15


def test_compare_takes_data_like_train(tiny_base, tmp_path, capsys):  # noqa: F811
    train = write_csv(tmp_path / "train.csv", sentiment_rows(64, 3), ["review", "stars"])
    test = write_csv(tmp_path / "test.csv", sentiment_rows(16, 4), ["review", "stars"])
    out = tmp_path / "cmp"
    rc = cli.main(["compare", "--data", str(train), "--test", str(test), "--text", "review", "--label", "stars",
                   "--strategies", "scalar-mix,concat", "--out", str(out), "--no-isolate", "--inference-rows", "8",
                   "--set", f"model.base={tiny_base}", "--set", "head.num_heads=2", "--set", "train.max_epochs=1",
                   "--set", f"cache.dir={tmp_path / 'cache'}", "--set", "train.device=cpu"])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    assert "settings from" in printed and "cola.yaml" in printed
    saved = json.loads((out / "compare.json").read_text())
    assert [s["spec"] for s in saved["strategies"]] == ["scalar-mix", "concat"]
    assert saved["config"]["task"]["name"] == "files" and saved["config"]["task"]["files"]["text"] == "review"
    assert all(s["test"]["n"] == 16 for s in saved["strategies"])


def test_compare_without_config_or_data_says_what_to_give(capsys):
    assert cli.main(["compare", "--out", "x", "--strategies", "concat"]) == 2
    assert "give a config file (see configs/), or your data: --data FILE" in capsys.readouterr().err
