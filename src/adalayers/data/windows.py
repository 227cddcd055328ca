"""Cutting in order, without torch: words into windows, texts into slices, rows into passes, and the first
sub-token of each word (the one that carries its tag). Training, evaluation and every inference path (the
torch-free llama.cpp serving path included) cut with these, so they see the same windows.
"""
from __future__ import annotations

from typing import Iterator


def word_windows(counts: list[int], budget: int) -> list[tuple[int, int]]:
    """Split words into windows of at most `budget` sub-tokens, at word boundaries: [(first, last + 1)].

    counts[w] = sub-tokens of word w. A single word longer than the budget gets a window of its own
    (the tokenizer truncates it). Training (token tasks) and serving (long texts) both cut with this,
    so they see the same windows.
    """
    return consecutive(counts, budget)


def consecutive(sizes: list[int], budget: int, most: int | None = None) -> list[tuple[int, int]]:
    """Items in order, cut into runs [(first, last + 1)] of at most `budget` in total size and `most` items: a
    run closes before the item that would overflow it; an item larger than the budget gets a run of its own.
    (Words into windows, a request's texts into slices, rows into llama.cpp passes.)"""
    runs, start, used = [], 0, 0
    for i, n in enumerate(sizes):
        if i > start and (used + n > budget or (most is not None and i - start >= most)):
            runs.append((start, i))
            start, used = i, 0
        used += n
    runs.append((start, len(sizes)))
    return runs


def first_subtokens(word_ids: list[int | None]) -> Iterator[tuple[int, int]]:
    """(position, word) of each word's first sub-token in a row's word ids (None: a special token): the
    one token that carries the word's tag, in training, evaluation and every inference path."""
    seen = set()
    for pos, w in enumerate(word_ids):
        if w is not None and w not in seen:
            seen.add(w)
            yield pos, w
