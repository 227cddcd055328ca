"""The one output schema of every inference door (CLI, SideTasks, the service, predict-files, generation).

    classes / binary    {"label": most probable label, "probabilities": {label: p}}
    regression          {"value": v}
    tokens              {"words": [...], "tags": [...], "scores": [...], "entities": [...]}   (entities: IOB2 tags)

Token heads: the words are the text's whitespace-separated pieces (character spans of \\S+); a token belongs
to the word holding its first character, and each word's tag is read at its first sub-token
(adalayers.data.encoding.first_subtokens, the rule training uses).
"""
from __future__ import annotations

import bisect
import re

from adalayers.data.windows import first_subtokens
from adalayers.entities import entity_spans
from adalayers.kinds import TaskKind

IOB = re.compile(r"^(O|[BIES]-.+)$")
WORD = re.compile(r"\S+")


def word_spans(text: str) -> list[tuple[int, int]]:
    """The character spans of the text's whitespace-separated words."""
    return [m.span() for m in WORD.finditer(text)]


def word_ids(offsets, spans: list[tuple[int, int]], shift: int = 0) -> list[int | None]:
    """Token -> index of the whitespace-separated word holding its first character (None: special).
    `offsets`: the tokens' character offsets, in a text that starts at character `shift` of the spans' text."""
    starts = [a for a, _ in spans]
    ids = []
    for a, b in offsets:
        if b <= a:
            ids.append(None)
            continue
        w = bisect.bisect_right(starts, a + shift) - 1
        ids.append(w if w >= 0 and a + shift < spans[w][1] else None)
    return ids


def sequence_output(kind: str, labels: list[str], values) -> dict:
    """A sequence head's values (probabilities, or the value of a regression head) -> its answer."""
    if kind == TaskKind.REGRESSION:
        return {"value": float(values)}
    probs = values.tolist()
    best = max(range(len(probs)), key=probs.__getitem__)
    return {"label": labels[best], "probabilities": dict(zip(labels, probs))}


def tag_words(labels: list[str], text: str, spans, rows) -> dict:
    """Per word: the tag of its first sub-token and that tag's probability; IOB2 tags also as entity spans.
    `rows`: (word ids per position, probabilities (T, k)) of every row reading the text (its windows in
    order): a word is read in the first row that holds it."""
    outside = labels.index("O") if "O" in labels else 0
    tags, scores = [labels[outside]] * len(spans), [None] * len(spans)
    for ids, probs in rows:
        for pos, w in first_subtokens(ids):
            if scores[w] is not None:
                continue  # read already, in an earlier window
            best = int(probs[pos].argmax())
            tags[w], scores[w] = labels[best], float(probs[pos, best])
    out = {"words": [text[a:b] for a, b in spans], "tags": tags, "scores": scores}
    if all(IOB.match(t) for t in labels):
        out["entities"] = [{"type": kind, "text": text[spans[a][0]:spans[b][1]], "start": spans[a][0],
                            "end": spans[b][1], "words": [a, b + 1]} for kind, a, b in entity_spans(tags)]
    return out


def head_output(kind: str, labels: list[str], values, text: str,
                offsets: list[tuple[int, int]] | None = None) -> dict:
    """One head's answer on one text: a sequence head's values, or a token head's per-position
    probabilities (T, k) with the character offsets of those positions in `text`."""
    if kind != TaskKind.TOKENS:
        return sequence_output(kind, labels, values)
    spans = word_spans(text)
    offsets = list(offsets or [])
    return tag_words(labels, text, spans, [(word_ids(offsets, spans), values[: len(offsets)])])
