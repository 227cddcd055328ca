"""A short training on real CoLA rows with the real MiniLM must beat the majority class on held-out rows."""
import json

import pytest

from adalayers import config
from adalayers.recipes import service

from conftest import DATA, needs_data


@needs_data
@pytest.mark.slow
def test_short_cola_training_beats_majority(tmp_path, monkeypatch):
    monkeypatch.setenv("ADALAYERS_CACHE", str(tmp_path / "cache"))
    cfg = config.from_dict({"task": {"name": "cola", "data_dir": str(DATA), "max_train_examples": 1200,
                                     "max_eval_examples": 400},
                            "model": {"base": "minilm-l6", "max_length": 40},
                            "train": {"lr": 1e-3, "batch_size": 32, "max_epochs": 6, "early_stopping": 6,
                                      "seed": 0}})
    metrics = service.train(cfg, tmp_path / "run")
    assert metrics["test"]["n"] == 400
    assert metrics["test"]["mcc"] > 0.0, metrics["test"]
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert set(saved) >= {"validation", "test", "trainable_params", "base_params", "train_seconds"}
    assert saved["trainable_params"] < 0.02 * saved["base_params"]
    # the round trip through the run folder predicts the same labels
    preds = service.predict(tmp_path / "run", ["The book was written by John.", "Book the was by John written."])
    assert [p["label"] for p in preds][0] in ("acceptable", "unacceptable")
    assert abs(sum(preds[0]["probabilities"].values()) - 1) < 1e-4
