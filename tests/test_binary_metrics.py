"""Binary classification: precision, recall and F1 of the positive class, and the confusion matrix with
named axes, checked by hand and against scikit-learn on a fixed set; task.positive_label end to end."""
from __future__ import annotations

import json

import pytest
from sklearn.metrics import confusion_matrix, f1_score, precision_score, recall_score

from adalayers import config, metrics
from adalayers.recipes import service
from adalayers.errors import ConfigError
from adalayers.data.tasks import load_task

from test_files_task import sentiment_rows, tiny, tiny_base, write_csv  # noqa: F401  (tiny_base: a fixture)

# 0 = neg, 1 = pos. TP 3, FN 1, FP 2, TN 2.
Y_TRUE = [1, 1, 1, 1, 0, 0, 0, 0]
Y_PRED = [1, 1, 1, 0, 1, 1, 0, 0]


def test_positive_class_scores_by_hand_and_against_sklearn():
    m = metrics.classification(Y_TRUE, Y_PRED, ["neg", "pos"])
    assert m["positive_label"] == "pos"
    assert m["positive_precision"] == pytest.approx(3 / 5) == precision_score(Y_TRUE, Y_PRED)
    assert m["positive_recall"] == pytest.approx(3 / 4) == recall_score(Y_TRUE, Y_PRED)
    assert m["positive_f1"] == pytest.approx(2 / 3) == pytest.approx(f1_score(Y_TRUE, Y_PRED))
    assert m["confusion"] == {"rows": "true", "columns": "predicted", "labels": ["neg", "pos"],
                              "matrix": [[2, 2], [1, 3]]}
    assert m["confusion"]["matrix"] == confusion_matrix(Y_TRUE, Y_PRED).tolist()
    neg = metrics.classification(Y_TRUE, Y_PRED, ["neg", "pos"], positive=0)
    assert neg["positive_label"] == "neg"
    assert neg["positive_precision"] == pytest.approx(2 / 3) == precision_score(Y_TRUE, Y_PRED, pos_label=0)
    assert neg["positive_recall"] == pytest.approx(2 / 4) == recall_score(Y_TRUE, Y_PRED, pos_label=0)
    assert neg["positive_f1"] == pytest.approx(f1_score(Y_TRUE, Y_PRED, pos_label=0))


def test_multiclass_gets_the_confusion_matrix_only():
    t, p = [0, 1, 2, 2, 1], [0, 2, 2, 1, 1]
    m = metrics.classification(t, p, ["a", "b", "c"])
    assert "positive_f1" not in m
    assert m["confusion"]["matrix"] == confusion_matrix(t, p).tolist() == [[1, 0, 0], [0, 1, 1], [0, 1, 1]]


def test_a_class_never_predicted_scores_zero_without_warnings():
    m = metrics.classification([0, 1, 1], [0, 0, 0], ["neg", "pos"])
    assert m["positive_precision"] == 0.0 and m["positive_f1"] == 0.0
    assert m["confusion"]["matrix"] == [[1, 0], [2, 0]]


def test_positive_label_is_checked_and_stated(tmp_path):
    train = write_csv(tmp_path / "train.csv", sentiment_rows(40, 1), ["text", "label"])
    data = load_task(config.from_dict({"task": {"train": str(train)}}))
    assert any("positive class for precision/recall/F1: 'pos'" in n for n in data.notes)
    data = load_task(config.from_dict({"task": {"train": str(train), "positive_label": "neg"}}))
    assert any("'neg'" in n for n in data.notes)
    with pytest.raises(ConfigError, match="'good' is not a label of task files \\(labels: neg, pos\\)"):
        load_task(config.from_dict({"task": {"train": str(train), "positive_label": "good"}}))
    three = write_csv(tmp_path / "three.csv", [[f"text {i}", "abc"[i % 3]] for i in range(30)], ["text", "label"])
    with pytest.raises(ConfigError, match="not a binary classification task"):
        load_task(config.from_dict({"task": {"train": str(three), "metric": "positive_f1"}}))


def test_run_reports_positive_f1_and_confusion_in_metrics_json(tiny_base, tmp_path):  # noqa: F811
    train = write_csv(tmp_path / "train.csv", sentiment_rows(120, 1), ["text", "label"])
    test = write_csv(tmp_path / "test.csv", sentiment_rows(40, 2), ["text", "label"])
    cfg = tiny(tiny_base, {"train": str(train), "test": str(test), "positive_label": "neg",
                           "metric": "positive_f1"}, epochs=2)
    service.train(cfg, tmp_path / "run")
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    m = saved["test"]
    assert m["positive_label"] == "neg" and 0.0 <= m["positive_f1"] <= 1.0
    assert m["confusion"]["rows"] == "true" and m["confusion"]["labels"] == ["neg", "pos"]
    assert sum(map(sum, m["confusion"]["matrix"])) == m["n"] == 40
    tp, fn = m["confusion"]["matrix"][0]  # positive = neg: row 0 holds the true negs, column 0 predicted neg
    assert m["positive_recall"] == pytest.approx(tp / (tp + fn) if tp + fn else 0.0)
