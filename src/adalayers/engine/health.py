"""After training: one-line warnings about a head whose numbers cannot be trusted, each with what to try.

- one answer: a classification head that predicts the same label for every validation row (it learned
  no more than a constant), a token head that gives every word the same tag, a regression head whose
  predictions do not vary;
- a tiny validation set (fewer than MIN_VALIDATION rows): the kept epoch and the validation metric are
  chosen on a handful of rows, mostly by chance.

`few_step_defaults` gives a small data set set up by the `--data` shortcut a learning rate and an
epoch count that fit it (the built-in configs' are made for thousands of rows).
"""
from __future__ import annotations

import math

from adalayers.kinds import TaskKind

MIN_VALIDATION = 30    # rows; below it a validation metric moves by 1/n per row
FEW_STEPS = 2_000      # optimizer steps in max_epochs below which the shortcut's small-data defaults apply
SMALL_DATA_LR = 1e-3
MAX_SMALL_EPOCHS = 200


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


def few_step_defaults(train: dict, n_train: int) -> str | None:
    """A small training set: raise `train`'s lr and max_epochs (a config dict's train section, changed in
    place) so the head gets about FEW_STEPS steps, and early_stopping with them; returns the log line
    saying so, or None when the data gives enough steps as it is."""
    per_epoch = max(1, math.ceil(n_train / train["batch_size"]))
    if per_epoch * train["max_epochs"] >= FEW_STEPS:
        return None
    old = dict(train)
    train["lr"] = max(train["lr"], SMALL_DATA_LR)
    train["max_epochs"] = max(train["max_epochs"], min(MAX_SMALL_EPOCHS, math.ceil(FEW_STEPS / per_epoch)))
    train["early_stopping"] = max(train["early_stopping"], train["max_epochs"] // 4)
    changed = ", ".join(f"train.{k} {train[k]:g} (not {old[k]:g})" for k in ("lr", "max_epochs", "early_stopping")
                        if train[k] != old[k])
    if not changed:
        return None
    return (f"small data set: {n_train:,} training rows give {per_epoch} steps an epoch, so {changed}; "
            f"--set them to choose")
