"""Stanford Sentiment Treebank from its PTB trees: train.txt, dev.txt, test.txt (one tree a line).

Every node carries a label 0-4; the sentence's label is the root's, its text the leaves joined by
spaces (-LRB- / -RRB- turned back into parentheses).
sst5: the five root labels. sst2: 0-1 negative, 3-4 positive, neutral (2) sentences dropped.
Validation = dev.txt, test = test.txt (the standard splits).
"""
from __future__ import annotations

import re
from pathlib import Path

from adalayers.data.tasks.base import Example, TaskData, bad_row, read_lines, register
from adalayers.kinds import TaskKind

SST5_LABELS = ["very negative", "negative", "neutral", "positive", "very positive"]
SST2_LABELS = ["negative", "positive"]
_TOKEN = re.compile(r"\(|\)|[^\s()]+")
_BRACKETS = {"-LRB-": "(", "-RRB-": ")", "-LSB-": "[", "-RSB-": "]", "-LCB-": "{", "-RCB-": "}"}


def parse_tree(line: str) -> tuple[int, list[str]]:
    """(root label, leaf words) of one PTB tree; ValueError says what is wrong."""
    tokens = _TOKEN.findall(line)
    if len(tokens) < 4 or tokens[0] != "(" or tokens[1] not in "01234" or len(tokens[1]) != 1:
        raise ValueError("a tree must start with '(' and a label 0-4")
    depth, words, prev = 0, [], None
    for i, tok in enumerate(tokens):
        if tok == "(":
            depth += 1
            if i + 1 >= len(tokens) or tokens[i + 1] not in ("0", "1", "2", "3", "4"):
                raise ValueError(f"node {tokens[i:i + 2]} has no label 0-4")
        elif tok == ")":
            depth -= 1
            if depth < 0:
                raise ValueError("unbalanced parentheses (too many ')')")
            if depth == 0 and i != len(tokens) - 1:
                raise ValueError("text after the end of the tree")
        elif prev != "(":  # a label follows '('; anything else is a word
            words.append(_BRACKETS.get(tok, tok))
        prev = tok
    if depth != 0:
        raise ValueError("unbalanced parentheses (missing ')')")
    if not words:
        raise ValueError("a tree without words")
    return int(tokens[1]), words


def read_trees(path: Path) -> list[tuple[int, str]]:
    rows = []
    for n, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        try:
            label, words = parse_tree(line)
        except ValueError as e:
            bad_row(f"{path}:{n}: not a sentiment tree: {e}")
            continue
        rows.append((label, " ".join(words)))
    return rows


def _load(cfg, name: str, fine: bool) -> TaskData:
    folder = cfg.data_dir() / "sst"
    files = [folder / f"{s}.txt" for s in ("train", "dev", "test")]
    splits = {}
    for split, path in zip(("train", "validation", "test"), files):
        trees = read_trees(path)
        if fine:
            splits[split] = [Example(text=t, label=SST5_LABELS[y]) for y, t in trees]
        else:
            splits[split] = [Example(text=t, label=SST2_LABELS[y >= 3]) for y, t in trees if y != 2]
    note = "root labels 0-4" if fine else "root labels 0-1 negative, 3-4 positive; neutral (2) dropped"
    return TaskData(name, TaskKind.CLASSIFICATION, SST5_LABELS if fine else SST2_LABELS, splits,
                    main_metric="accuracy", files=files,
                    notes=[f"{note}; validation = dev.txt, test = test.txt"])


@register("sst5")
def sst5(cfg) -> TaskData:
    return _load(cfg, "sst5", fine=True)


@register("sst2")
def sst2(cfg) -> TaskData:
    return _load(cfg, "sst2", fine=False)
