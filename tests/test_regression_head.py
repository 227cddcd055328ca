"""A regression head on the frozen MiniLM learns a simple monotone target on real sentences.

The target is the sentence's length in words, scaled to 0-5 (STS-B's range). Before the head's
output was put in the targets' standard units it started near 0, far below the targets' mean,
and a short training spent itself on the offset: worse than predicting the mean (the 300-row
STS-B result of compare-multitask was a negative correlation).
"""
import json

import numpy as np
import pytest

from adalayers import config
from adalayers.recipes import service
from adalayers.data.tasks import TASKS, Example, TaskData
from adalayers.data.tasks.sst import read_trees

from conftest import DATA

SST_DEV = DATA / "sst" / "dev.txt"


def _length_task(cfg) -> TaskData:
    texts = [t for _, t in read_trees(SST_DEV)][:224]
    rows = [Example(text=t, label=5.0 * min(len(t.split()), 30) / 30) for t in texts]
    splits = {"train": rows[:160], "validation": rows[160:192], "test": rows[192:]}
    return TaskData("t-length", "regression", [], splits, "pearson", files=[SST_DEV])


@pytest.mark.slow
@pytest.mark.skipif(not SST_DEV.is_file(), reason=f"real data not found at {SST_DEV}")
def test_regression_head_learns_a_monotone_target_on_real_sentences(tmp_path, monkeypatch):
    monkeypatch.setitem(TASKS, "t-length", _length_task)
    cfg = config.from_dict({"task": {"name": "t-length"}, "model": {"base": "minilm-l6", "max_length": 32},
                            "train": {"lr": 1e-3, "batch_size": 32, "max_epochs": 6, "early_stopping": 6, "seed": 0,
                                      "num_threads": 1}})
    m = service.train(cfg, tmp_path / "run")
    saved = config.from_dict(json.loads((tmp_path / "run" / "config.json").read_text())["config"])
    train_y = [e.label for e in _length_task(cfg).splits["train"]]
    assert saved.head.target_mean == pytest.approx(np.mean(train_y))  # the scale travels with the run
    assert saved.head.target_std == pytest.approx(np.std(train_y))
    test_y = np.array([e.label for e in _length_task(cfg).splits["test"]])
    assert m["test"]["pearson"] > 0.6, m["test"]
    assert m["test"]["mse"] < 0.5 * test_y.var(), (m["test"], test_y.var())  # clearly better than the mean
    # the saved run predicts on the targets' scale
    short, long_ = service.predict(tmp_path / "run", ["Fine .", " ".join(["a long and winding sentence"] * 6)])
    assert short["value"] < long_["value"]
