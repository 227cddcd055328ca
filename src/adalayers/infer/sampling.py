"""The next token of each row from its logits: greedy, or a draw (temperature, top_k, top_p), in numpy.

One sampler for every runtime (the torch runtime hands its logits over as numpy, llama.cpp gives them so), each
request drawing from its own numpy Generator (infer/request.Job), so a seed gives the same text whatever runs
beside it.
"""
from __future__ import annotations

import numpy as np

from adalayers.infer.params import Sampling


def generator(seed: int | None) -> np.random.Generator | None:
    """A request's own generator (None: unseeded, numpy's fresh entropy per draw); any integer seed (OpenAI's may be
    negative) taken modulo 2^64."""
    return np.random.default_rng(int(seed) % (1 << 64)) if seed is not None else None


def sample(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator | None) -> np.ndarray:
    """Greedy argmax, or a draw from p = softmax(logits / temperature) restricted to the top_k (0 = all)
    and to the nucleus: the most likely tokens whose probabilities, in decreasing order, sum to top_p
    (a token is kept when the mass before it is below top_p; the first one always). logits (B, V) -> (B,) ids."""
    logits = np.asarray(logits, dtype=np.float32)
    if not sampling.do_sample:
        return logits.argmax(-1)
    x = logits.astype(np.float64) / max(sampling.temperature, 1e-6)
    top_k, top_p = sampling.top_k, sampling.top_p
    if top_k and top_k < x.shape[-1]:
        kth = -np.partition(-x, top_k - 1, axis=-1)[:, top_k - 1:top_k]
        x = np.where(x < kth, -np.inf, x)
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    if top_p < 1.0:
        order = np.argsort(-p, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(p, order, -1)
        out = (np.cumsum(sorted_p, -1) - sorted_p) >= top_p
        drop = np.zeros_like(out)
        np.put_along_axis(drop, order, out, -1)
        p = np.where(drop, 0.0, p)
        p /= p.sum(-1, keepdims=True)
    rng = rng if rng is not None else np.random.default_rng()
    u = rng.random((p.shape[0], 1))
    return np.minimum((np.cumsum(p, -1) < u).sum(-1), p.shape[-1] - 1)
