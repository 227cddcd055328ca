"""Task metrics: thin wrappers over scikit-learn, scipy and seqeval."""
from __future__ import annotations

import numpy as np

# Per task kind: the metrics that can select the best epoch (higher is better); the first is the default.
MAIN_METRICS = {"sequence": ["macro_f1", "accuracy", "mcc"],
                "regression": ["pearson", "spearman"],
                "token": ["f1", "precision", "recall"]}


def classification(y_true: list[int], y_pred: list[int], labels: list[str]) -> dict:
    from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

    return {"accuracy": float(accuracy_score(y_true, y_pred)),
            "mcc": float(matthews_corrcoef(y_true, y_pred)),
            "macro_f1": float(f1_score(y_true, y_pred, average="macro", labels=list(range(len(labels))),
                                       zero_division=0)),
            "n": len(y_true)}


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
