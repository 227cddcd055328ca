"""Entity spans from a sequence of tags, by the CoNLL shared task's conlleval rules.

A tag is `O` or `P-TYPE` with P one of B, I, E, S (IOB1, IOB2 and IOBES alike). Walking the tags with an
`O` appended, with the previous tag's prefix p and type t and the current one's P and T (`O` has the type `_`):

    an entity ends before this tag     if p in {E, S}, or p in {B, I} and P in {B, S, O}, or p != O and t != T
    an entity starts at this tag       if P in {B, S}, or p in {E, S, O} and P in {E, I}, or P != O and t != T

so a predicted I-X after O still opens an entity, as conlleval and seqeval's default mode count it (the strict
IOB2 mode would drop it). These are exactly seqeval's `get_entities` (tests/test_entity_metrics.py checks
them against it on random sequences of every prefix); written here because that function's module imports
scikit-learn and SciPy, over 100 MB of memory in the torch-free serving process, which needs only this.
"""
from __future__ import annotations


def _split(tag: str) -> tuple[str, str]:
    """(prefix, type): 'B-PER' -> ('B', 'PER'), 'O' -> ('O', '_')."""
    return tag[0], tag[1:].split("-", maxsplit=1)[-1] or "_"


def entity_spans(tags: list[str]) -> list[tuple[str, int, int]]:
    """(type, first, last) of each entity in `tags`, positions inclusive, in order:
    ['B-PER', 'I-PER', 'O', 'B-LOC'] -> [('PER', 0, 1), ('LOC', 3, 3)]."""
    spans: list[tuple[str, int, int]] = []
    prev, prev_type, begin = "O", "", 0
    for i, tag in enumerate([*tags, "O"]):
        cur, cur_type = _split(tag)
        if prev in "ES" or (prev in "BI" and cur in "BSO") or (prev != "O" and prev_type != cur_type):
            spans.append((prev_type, begin, i - 1))
        if cur in "BS" or (prev in "ESO" and cur in "EI") or (cur != "O" and prev_type != cur_type):
            begin = i
        prev, prev_type = cur, cur_type
    return spans
