"""Task metrics: thin wrappers over scikit-learn, scipy and seqeval."""
from __future__ import annotations

import numpy as np
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
    """Entity-level precision/recall/F1 (micro over entities, and per class), via seqeval.

    seqeval's default mode follows the CoNLL shared task's conlleval script (the numbers papers
    report): a predicted I-X after O still opens an entity. The strict IOB2 mode would drop such
    entities and score a little lower than the literature; gold tags are valid IOB2 either way.
    """
    from seqeval.metrics import classification_report, f1_score, precision_score, recall_score

    kw = {"zero_division": 0}
    report = classification_report(tags_true, tags_pred, output_dict=True, **kw)
    per_class = {name: {"precision": float(v["precision"]), "recall": float(v["recall"]),
                        "f1": float(v["f1-score"]), "support": int(v["support"])}
                 for name, v in report.items() if not name.endswith("avg")}
    return {"f1": float(f1_score(tags_true, tags_pred, **kw)),
            "precision": float(precision_score(tags_true, tags_pred, **kw)),
            "recall": float(recall_score(tags_true, tags_pred, **kw)),
            "per_class": per_class, "n": len(tags_true), "words": sum(len(t) for t in tags_true)}
