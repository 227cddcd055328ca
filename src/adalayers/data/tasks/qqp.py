"""The labelled Quora Question Pairs subset: qqp/subset.tsv (no header).

Columns: id, qid1, qid2, question1, question2, is_duplicate (0/1). The file's first line has its
label joined to question2 by a space instead of a tab; a 5-column line whose last field ends in
" 0" or " 1" is read that way. Splits: stratified 80/10/10 (train / validation / test) by label,
seed task.split_seed (42).
The file holds 23,497 pairs (8,747 duplicates); data/README.md says 23,496, one short: it reads
every line as a pair, the joined-label first line included.
A pair task: Example.text / text_pair (the cross-encoder input is the tokenizer's pair encoding).
"""
from __future__ import annotations

import re
from pathlib import Path

from adalayers.errors import DataError
from adalayers.data.tasks.base import Example, TaskData, bad_row, read_lines, register
from adalayers.kinds import TaskKind

QQP_LABELS = ["not_duplicate", "duplicate"]
_JOINED_LABEL = re.compile(r"^(.*\S)\s+([01])$")


def read_pairs(path: Path) -> list[Example]:
    rows = []
    for n, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) == 5 and (m := _JOINED_LABEL.match(cols[4])):
            cols = cols[:4] + [m.group(1), m.group(2)]  # the label joined by a space (first line)
        if len(cols) != 6:
            bad_row(f"{path}:{n}: expected 6 tab-separated columns (id, qid1, qid2, question1, "
                    f"question2, is_duplicate), got {len(cols)}")
        elif cols[5].strip() not in ("0", "1"):
            bad_row(f"{path}:{n}: is_duplicate must be 0 or 1, got {cols[5]!r}")
        elif not cols[3].strip() or not cols[4].strip():
            bad_row(f"{path}:{n}: empty question")
        else:
            q1, q2 = cols[3].strip(), cols[4].strip()
            rows.append(Example(text=q1, text_pair=q2, label=QQP_LABELS[int(cols[5])]))
    return rows


def split_80_10_10(examples: list[Example], seed: int) -> dict[str, list[Example]]:
    from sklearn.model_selection import train_test_split

    idx = list(range(len(examples)))
    labels = [e.label for e in examples]
    try:
        train, rest = train_test_split(idx, test_size=0.2, random_state=seed, stratify=labels)
        val, test = train_test_split(rest, test_size=0.5, random_state=seed, stratify=[labels[i] for i in rest])
    except ValueError as e:
        raise DataError(f"cannot split {len(examples)} pairs 80/10/10 by label: {e}") from None
    return {name: [examples[i] for i in sorted(part)] for name, part in
            (("train", train), ("validation", val), ("test", test))}


@register("qqp", pairs=True)
def qqp(cfg) -> TaskData:
    path = cfg.data_dir() / "qqp" / "subset.tsv"
    splits = split_80_10_10(read_pairs(path), cfg.task.split_seed)
    return TaskData("qqp", TaskKind.CLASSIFICATION, QQP_LABELS, splits, main_metric="accuracy", files=[path],
                    notes=[f"stratified 80/10/10 split of subset.tsv (seed {cfg.task.split_seed}): "
                           f"{', '.join(f'{k} {len(v)}' for k, v in splits.items())}"])
