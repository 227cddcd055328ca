"""A decode step's head work in two halves, the second on another thread, where the cores are free for it.

Where llama.cpp's threads use every core, a step's head work runs after llama_decode returns (LlamaCpp.beside
is false), and then the cores its threads used are free: the work of several rows is split in two, one half
here and one on the engine's side thread (LlamaCpp.after_split). The halves are fixed by the work, not by
whether a thread is given: without one they run here one after the other, so the values do not depend on
it (each half is whole rows or whole sequences: their products and sums are the same).

    in_two(pool, first, second)       first() here while second() runs on pool (None: first(), then second())
    halves(weights)                   where to cut a list in two of about equal summed weight
"""
from __future__ import annotations

from concurrent.futures import Executor
from typing import Callable, Sequence


def in_two(pool: Executor | None, first: Callable[[], object], second: Callable[[], object]) -> None:
    """Both halves done before it returns; an error in either is raised (the second's after the first ends)."""
    if pool is None:
        first()
        second()
        return
    done = pool.submit(second)
    try:
        first()
    finally:
        done.result()


def halves(weights: Sequence[float]) -> int:
    """The cut c (0 <= c <= len) such that weights[:c] and weights[c:] sum about equally: the first c items go
    to the first half (one item: all in the first, c = 1, nothing for another thread)."""
    total, run = sum(weights), 0.0
    for c, w in enumerate(weights):
        if run + w / 2 > total / 2:
            return c
        run += w
    return len(weights)
