"""Run a side task over a split and score it: logits per row -> predictions per example -> metrics."""
from __future__ import annotations

from adalayers import metrics
from adalayers.data.encoding import EncodedSplit, batch_plan, split_batch
from adalayers.data.encoding import first_subtokens as encoding_first_subtokens
from adalayers.engine import predict, probabilities_or_values
from adalayers.kinds import TaskKind
from adalayers.model.states import Fed
from adalayers.data.tasks import Example


def row_outputs(task, source, split: EncodedSplit, batch_size: int, pad_id: int, autocast=None) -> list:
    """Per row: class probabilities (sequence), a value (regression) or per-token probabilities (token)."""
    return model_outputs(Fed(task, source), split, batch_size, pad_id, autocast)


def model_outputs(model, split: EncodedSplit, batch_size: int, pad_id: int, autocast=None) -> list:
    """row_outputs for any Trainable with a `kind` (the side task fed by a source, a strategy's model)."""
    return predict(model, batch_plan(split, batch_size), lambda idx: split_batch(split, idx, pad_id),
                   len(split.rows), probabilities_or_values(model.kind), autocast)


def first_subtokens(row: dict):
    """Token tasks: (position, word) of each word's first sub-token in an encoded row (the one rule:
    adalayers.data.encoding.first_subtokens)."""
    return encoding_first_subtokens(row["word_ids"])


def word_outputs(split: EncodedSplit, outs: list):
    """Token tasks: (example, word, probabilities) for every word, read at its first sub-token."""
    for row, probs in zip(split.rows, outs):
        for pos, w in first_subtokens(row):
            yield row["example"], row["word_start"] + w, probs[pos]


def example_predictions(task, split: EncodedSplit, outs: list, examples: list[Example]) -> list:
    """Rows back to examples: label index + probabilities, a value, or one tag per word."""
    if task.kind == TaskKind.REGRESSION:
        return list(outs)  # one row per example, in order
    if task.kind == TaskKind.CLASSIFICATION:
        return [(int(p.argmax()), p.tolist()) for p in outs]
    outside = task.labels.index("O") if "O" in task.labels else 0
    # a word with no sub-token at all (possible for odd characters) keeps "O"
    tags = [[task.labels[outside]] * len(e.words) for e in examples]
    for row, probs in zip(split.rows, outs):
        best = probs.argmax(-1).tolist()  # one call per row, not one per word
        for pos, w in first_subtokens(row):
            tags[row["example"]][row["word_start"] + w] = task.labels[best[pos]]
    return tags


def positive_index(cfg, labels: list[str]) -> int | None:
    """The positive class of a binary task: task.positive_label, else the second label (None: not binary)."""
    if len(labels) != 2:
        return None
    name = getattr(getattr(cfg, "task", None), "positive_label", None)
    return labels.index(name) if name in labels else 1


def score(task, examples: list[Example], preds: list) -> dict:
    if task.kind == TaskKind.REGRESSION:
        return metrics.regression([e.label for e in examples], preds)
    if task.kind == TaskKind.CLASSIFICATION:
        label_id = {name: i for i, name in enumerate(task.labels)}
        return metrics.classification([label_id[e.label] for e in examples], [p[0] for p in preds], task.labels,
                                      positive_index(getattr(task, "cfg", None), task.labels))
    return metrics.entities([e.tags for e in examples], preds)


def evaluate_split(task, source, split: EncodedSplit, examples: list[Example], batch_size: int, pad_id: int,
                   autocast=None) -> tuple[dict, list]:
    return evaluate_model(Fed(task, source), split, examples, batch_size, pad_id, autocast)


def evaluate_model(model, split: EncodedSplit, examples: list[Example], batch_size: int, pad_id: int,
                   autocast=None) -> tuple[dict, list]:
    """Metrics and predictions of a Trainable with `kind` and `labels` (a Fed side task or a strategy)."""
    outs = model_outputs(model, split, batch_size, pad_id, autocast)
    preds = example_predictions(model, split, outs, examples)
    return score(model, examples, preds), preds
