"""infer/sampling.sample against the plain sampler it replaces: softmax over the whole vocabulary, a full stable
sort for the nucleus, one cumulative sum in id order per draw."""
import numpy as np
import pytest

from adalayers.infer.params import Sampling
from adalayers.infer.sampling import BLOCK, pick, sample


def reference(logits: np.ndarray, s: Sampling, rng: np.random.Generator) -> np.ndarray:
    """The slow obvious sampler (float64, every id sorted)."""
    if not s.do_sample:
        return logits.argmax(-1)
    x = logits.astype(np.float64) / max(s.temperature, 1e-6)
    if s.top_k and s.top_k < x.shape[-1]:
        kth = -np.partition(-x, s.top_k - 1, axis=-1)[:, s.top_k - 1:s.top_k]
        x = np.where(x < kth, -np.inf, x)
    p = np.exp(x - x.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    if s.top_p < 1.0:
        order = np.argsort(-p, axis=-1, kind="stable")
        sorted_p = np.take_along_axis(p, order, -1)
        drop_sorted = (np.cumsum(sorted_p, -1) - sorted_p) >= s.top_p
        drop = np.zeros_like(drop_sorted)
        np.put_along_axis(drop, order, drop_sorted, -1)
        p = np.where(drop, 0.0, p)
        p /= p.sum(-1, keepdims=True)
    u = rng.random((p.shape[0], 1))
    return np.minimum((np.cumsum(p, -1) < u).sum(-1), p.shape[-1] - 1)


@pytest.mark.parametrize("vocab", [7, 50, 3000, 3 * BLOCK + 5])  # the last: blocks and a ragged one
def test_draws_equal_the_full_sort_samplers(vocab):
    rng = np.random.default_rng(vocab)
    draws = 0
    for scale in (0.5, 3.0, 12.0):  # flat to peaked
        logits = (rng.standard_normal((4, vocab)) * scale).astype(np.float32)
        for temperature in (0.5, 1.0, 2.0):
            for top_k in (0, 1, 5, vocab):
                for top_p in (1.0, 0.9, 0.55, 0.01):
                    s = Sampling(True, temperature, top_k, top_p, None)
                    for seed in range(4):
                        got = sample(logits, s, np.random.default_rng(seed))
                        want = reference(logits, s, np.random.default_rng(seed))
                        np.testing.assert_array_equal(got, want, err_msg=f"{s}, seed {seed}")
                        draws += len(got)
    assert draws == 3 * 3 * 4 * 4 * 4 * 4


def test_ties_keep_the_lower_id_in_the_nucleus_and_at_the_kth():
    uniform = np.zeros((1, 8), np.float32)  # mass before id j: j / 8, kept while below 0.3: ids 0, 1, 2
    seen = {int(sample(uniform, Sampling(True, 1.0, 0, 0.3, None), np.random.default_rng(i))[0]) for i in range(300)}
    assert seen == {0, 1, 2}
    tied = np.array([[0, 1, 0, 1, 1, 0]], np.float32)  # top_k 2: every id tied with the 2nd largest stays
    seen = {int(sample(tied, Sampling(True, 1.0, 2, 1.0, None), np.random.default_rng(i))[0]) for i in range(300)}
    assert seen == {1, 3, 4}


def test_an_id_of_no_mass_is_never_drawn():
    vocab = 2 * BLOCK + 10
    logits = np.full((3, vocab), -1e30, np.float32)
    allowed = [5, BLOCK - 1, BLOCK, 2 * BLOCK + 9]
    logits[:, allowed] = [0.0, 2.0, -1.0, 1.0]
    for s in (Sampling(True, 1.0, 0, 1.0, None), Sampling(True, 0.7, 0, 0.95, None), Sampling(True, 1.5, 3, 1.0, None)):
        drawn = {int(t) for i in range(200) for t in sample(logits, s, np.random.default_rng(i))}
        assert drawn <= set(allowed) and len(drawn) >= 2


def test_a_rounding_at_the_very_end_gives_the_last_id_with_mass():
    cumulative = np.array([0.5, 1.0, 1.0, 1.0])  # the last two ids have no mass
    assert pick(cumulative, 0.2) == 0 and pick(cumulative, 0.75) == 1
    assert pick(cumulative, 1.0) == 1   # u * total at the total itself: not id 3


def test_greedy_is_the_argmax():
    logits = np.random.default_rng(0).standard_normal((5, 300)).astype(np.float32)
    np.testing.assert_array_equal(sample(logits, Sampling(False), None), logits.argmax(-1))
