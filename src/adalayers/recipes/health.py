"""After training: one-line warnings about a head whose numbers cannot be trusted, each with what to try.

- one answer: a classification head that predicts the same label for every validation row (it learned
  no more than a constant), a token head that gives every word the same tag, a regression head whose
  predictions do not vary;
- a tiny validation set (fewer than MIN_VALIDATION rows): the kept epoch and the validation metric are
  chosen on a handful of rows, mostly by chance.
"""
from __future__ import annotations

from adalayers.kinds import TaskKind

MIN_VALIDATION = 30    # rows; below it a validation metric moves by 1/n per row


def one_answer(kind: str, labels: list[str], preds: list) -> str | None:
    """What the head answers for every row, when it answers the same for all of them (else None)."""
    if not preds:
        return None
    if kind == TaskKind.CLASSIFICATION:
        answers = {p[0] for p in preds}
        return f"'{labels[answers.pop()]}'" if len(answers) == 1 else None
    if kind == TaskKind.REGRESSION:
        return f"{preds[0]:.4g}" if max(preds) - min(preds) <= 1e-6 * max(1.0, abs(preds[0])) else None
    tags = {t for row in preds for t in row}
    return f"the tag '{tags.pop()}'" if len(tags) == 1 else None


def head_warnings(kind: str, labels: list[str], val_preds: list, train_cfg, epochs: int) -> list[str]:
    """The one-line warnings for a trained head, from its predictions on the validation rows."""
    out, n = [], len(val_preds)
    same = one_answer(kind, labels, val_preds)
    if same is not None:
        out.append(f"the head answers {same} for all {n:,} validation rows: it learned no more than a constant. "
                   f"Try a larger learning rate (--set train.lr={train_cfg.lr * 10:g}; it was {train_cfg.lr:g}), "
                   f"more epochs (--set train.max_epochs={max(2 * epochs, 20)}; it ran {epochs}) or more "
                   f"training rows")
    if 0 < n < MIN_VALIDATION:
        out.append(f"the validation set has only {n} rows: the kept epoch and the validation metric are mostly "
                   f"chance. Give more rows, a larger --set task.validation_fraction, or --validation FILE")
    return out
