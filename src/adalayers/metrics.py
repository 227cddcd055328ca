"""Task metrics: thin wrappers over scikit-learn and scipy; entity scores counted over adalayers.entities' spans
(checked against seqeval's scores in tests/test_entity_metrics.py)."""
from __future__ import annotations

import numpy as np

from adalayers.entities import entity_spans
from adalayers.kinds import TaskKind

# Per task kind: the metrics that can select the best epoch (higher is better); the first is the default.
MAIN_METRICS = {TaskKind.CLASSIFICATION: ["macro_f1", "accuracy", "mcc", "positive_f1"],  # positive_f1: binary tasks
                TaskKind.REGRESSION: ["pearson", "spearman"],
                TaskKind.TOKENS: ["f1", "precision", "recall"]}


def classification(y_true: list[int], y_pred: list[int], labels: list[str], positive: int | None = None) -> dict:
    """Accuracy, MCC, macro-F1 and the confusion matrix (rows = true label, columns = predicted, both in
    `labels` order). Binary tasks also get precision, recall and F1 of the positive class: label index
    `positive` (default 1, the second label), named in `positive_label`."""
    from sklearn.metrics import (accuracy_score, confusion_matrix, f1_score, matthews_corrcoef,
                                 precision_recall_fscore_support)

    ids = list(range(len(labels)))
    out = {"accuracy": float(accuracy_score(y_true, y_pred)),
           "mcc": float(matthews_corrcoef(y_true, y_pred)),
           "macro_f1": float(f1_score(y_true, y_pred, average="macro", labels=ids, zero_division=0))}
    if len(labels) == 2:
        pos = 1 if positive is None else positive
        p, r, f, _ = precision_recall_fscore_support(y_true, y_pred, labels=ids, pos_label=pos, average="binary",
                                                     zero_division=0)
        out.update(positive_label=labels[pos], positive_precision=float(p), positive_recall=float(r),
                   positive_f1=float(f))
    out["confusion"] = {"rows": "true", "columns": "predicted", "labels": list(labels),
                        "matrix": confusion_matrix(y_true, y_pred, labels=ids).tolist()}
    out["n"] = len(y_true)
    return out


def regression(y_true: list[float], y_pred: list[float]) -> dict:
    from scipy.stats import pearsonr, spearmanr

    t, p = np.asarray(y_true, float), np.asarray(y_pred, float)
    const = np.ptp(p) == 0 or np.ptp(t) == 0
    return {"pearson": 0.0 if const else float(pearsonr(t, p)[0]),
            "spearman": 0.0 if const else float(spearmanr(t, p)[0]),
            "mse": float(np.mean((t - p) ** 2)), "n": len(t)}


def entities(tags_true: list[list[str]], tags_pred: list[list[str]]) -> dict:
    """Entity-level precision/recall/F1 (micro over entities, and per class), as seqeval scores them.

    Entities are conlleval's, as seqeval's default mode finds them (adalayers.entities, the rule the served
    token heads' entities follow: a predicted I-X after O still opens an entity; the strict IOB2 mode would
    drop such entities and score a little lower than the literature), each sentence's apart. They are
    extracted once per side and counted here: seqeval's classification_report plus its three micro
    scores extract them 16 times, which made scoring CoNLL's validation set cost more than running
    the head over it. tests/test_entity_metrics.py checks every number against seqeval's own.
    """
    true, pred = _entity_sets(_sentences_spans(tags_true)), _entity_sets(_sentences_spans(tags_pred))
    counts = {name: (len(true.get(name, set()) & pred.get(name, set())), len(pred.get(name, ())), len(true.get(name, ())))
              for name in sorted(true.keys() | pred.keys())}  # (true positives, predicted, true) per class
    per_class = {name: _prf(*c) for name, c in counts.items()}
    micro = _prf(*(sum(c[i] for c in counts.values()) for i in range(3)))
    return {"f1": micro["f1"], "precision": micro["precision"], "recall": micro["recall"],
            "per_class": per_class, "n": len(tags_true), "words": sum(len(t) for t in tags_true)}


def _sentences_spans(sentences: list[list[str]]) -> list[tuple[str, tuple[int, int], tuple[int, int]]]:
    """(type, (sentence, first), (sentence, last)) of every entity of every sentence, as one list."""
    return [(kind, (n, first), (n, last)) for n, tags in enumerate(sentences)
            for kind, first, last in entity_spans(tags)]


def _entity_sets(spans) -> dict[str, set]:
    out: dict[str, set] = {}
    for kind, start, end in spans:
        out.setdefault(kind, set()).add((start, end))
    return out


def _prf(tp: int, pred: int, true: int) -> dict:
    """Precision, recall and F1 from counts; 0 where a denominator is 0 (seqeval's zero_division=0)."""
    p = tp / pred if pred else 0.0
    r = tp / true if true else 0.0
    return {"precision": p, "recall": r, "f1": 2 * p * r / (p + r) if p + r else 0.0, "support": true}
