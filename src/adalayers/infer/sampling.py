"""The next token of each row from its logits: greedy, or a draw (temperature, top_k, top_p), in numpy.

One sampler for every runtime (the torch runtime hands its logits over as numpy, llama.cpp gives them so), each
request drawing from its own numpy Generator (infer/request.Job), so a seed gives the same text whatever runs
beside it.

A draw is p = softmax(logits / temperature), restricted to the top_k (0 = all) and then to the nucleus: the most
likely tokens whose probabilities, in decreasing order (ties: the lower id first), sum to top_p (a token is kept
while the mass before it is below top_p; the first one always), renormalised; then one uniform u per row picks
the token whose cumulative mass, in id order, first passes u. A vocabulary is large (Gemma 3's 262,144 ids), so
nothing here sorts or sums the whole of it in a loop:
    - the top_k comes from a partial selection (np.partition); the nucleus from the first top set of ids that
      holds top_p of the mass (a top set that holds it holds the nucleus): the ids of probability at least 2^-10
      of the likeliest's, else 2^-12, 2^-14, ...; only those ids are sorted;
    - a draw over the whole vocabulary (no top_k, no top_p) finds u's block of 1,024 ids from the blocks' sums,
      then its id within that block.
The draws equal those of the plain full-sort sampler (tests/test_sampling.py) but for float rounding at a u that
falls on a boundary; that sampler's full sort of the vocabulary made a sampled request 0.34x llama-server's
tokens/s on gemma3-270m (docs/llm.md).
"""
from __future__ import annotations

import numpy as np

from adalayers.infer.params import Sampling

BLOCK = 1024  # ids per block of the whole-vocabulary draw


def generator(seed: int | None) -> np.random.Generator | None:
    """A request's own generator (None: unseeded, numpy's fresh entropy per draw); any integer seed (OpenAI's may be
    negative) taken modulo 2^64."""
    return np.random.default_rng(int(seed) % (1 << 64)) if seed is not None else None


def sample(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator | None) -> np.ndarray:
    """Greedy argmax, or a draw as the module says. logits (B, V) -> (B,) ids."""
    logits = np.asarray(logits, dtype=np.float32)
    if not sampling.do_sample:
        return logits.argmax(-1)
    p = logits / np.float32(max(sampling.temperature, 1e-6))
    p -= p.max(-1, keepdims=True)
    p = np.exp(p, out=p)  # unnormalised, the most likely at 1 (one (B, V) array: a vocabulary is large)
    vocab = p.shape[-1]
    top_k = sampling.top_k if 0 < sampling.top_k < vocab else 0
    rng = rng if rng is not None else np.random.default_rng()
    u = rng.random(p.shape[0])
    if not top_k and sampling.top_p >= 1.0:
        return _draw_whole(p, u)
    out = np.empty(len(p), np.int64)
    for r, row in enumerate(p):
        ids = _support(row, top_k, sampling.top_p)
        out[r] = ids[pick(np.cumsum(row[ids], dtype=np.float64), u[r])]
    return out


def _support(row: np.ndarray, top_k: int, top_p: float) -> np.ndarray:
    """The ids a draw may give, ascending: the top_k (every id tied with the k-th kept), then the nucleus."""
    total = None
    if top_k:
        ids = _largest(row, top_k)
    else:
        total = row.sum(dtype=np.float64)
        for exponent in range(10, 130, 2):  # the ids of p >= 2^-10, 2^-12, ... (the likeliest's p is 1)
            ids = np.flatnonzero(row >= np.float32(2.0 ** -exponent))
            if row[ids].sum(dtype=np.float64) >= top_p * total:  # a top set holding top_p holds the nucleus
                break
        else:
            ids = np.arange(len(row))
    if top_p >= 1.0:
        return ids
    q = row[ids].astype(np.float64)
    order = np.argsort(-q, kind="stable")  # ids ascending: ties keep the lower id first
    before = np.cumsum(q[order]) - q[order]
    return np.sort(ids[order[before < top_p * (q.sum() if top_k else total)]])


def _largest(row: np.ndarray, m: int) -> np.ndarray:
    """The ids of the m largest values, ascending, with every id tied with the m-th."""
    m = min(m, len(row))
    return np.flatnonzero(row >= np.partition(row, len(row) - m)[len(row) - m])


def _draw_whole(p: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Each row's draw over its whole vocabulary: u's block from the blocks' sums, then its id in the block."""
    starts = np.arange(0, p.shape[-1], BLOCK)
    blocks = np.cumsum(np.add.reduceat(p, starts, axis=-1, dtype=np.float64), -1)  # (B, blocks)
    out = np.empty(len(p), np.int64)
    for r in range(len(p)):
        b = pick(blocks[r], u[r])
        before = blocks[r, b - 1] if b else 0.0
        inside = np.cumsum(p[r, starts[b]:starts[b] + BLOCK], dtype=np.float64)
        out[r] = starts[b] + pick(inside, (u[r] * blocks[r, -1] - before) / inside[-1])
    return out


def pick(cumulative: np.ndarray, u: float) -> int:
    """The first place whose cumulative mass passes u of the total: never one of mass 0 (a float rounding that
    puts u at the very end gives the last place with mass)."""
    i = int(np.searchsorted(cumulative, u * cumulative[-1], side="right"))
    if i < len(cumulative):
        return i
    return int(np.flatnonzero(np.diff(cumulative, prepend=0.0) > 0)[-1])
