"""Online-softmax attention state of one sequence, extended by new positions, compiled (numba).

A sequence head's self-attention sees the whole text, so each new position changes every earlier query's
output. Per head h, attention head g and query i the state is the running max m, the sum l and the
accumulated values A (numpy_incremental's module doc):

    s_ij = q_i . k_j                     (q already scaled by dh^-1/2)
    m_i' = max(m_i, s_ij)                for each new key j in turn
    l_i' = l_i e^(m_i - m_i') + e^(s_ij - m_i')
    A_i' = A_i e^(m_i - m_i') + e^(s_ij - m_i') v_j

and a new query starts from m = max_j s_ij, l = sum_j e^(s_ij - m), A = sum_j e^(s_ij - m) v_j over every key so
far (the new ones included). Its output is A_i / l_i. The arrays hold each feature's values over the positions
side by side ((H, nh, dh, positions)), so that every loop over positions is elementwise and vectorised, the
exponentials included (fast_exp.exp_neg, inline; libm's expf, one call per query, stopped it): a decode step
of one head over 400 positions (8 attention heads of 8) takes about a third of the time it took with a query's
features side by side and libm's exponential (docs/llm.md has the step's reads in the paired benchmark).
tests/test_numpy_incremental.py holds the reads to the full read (numpy_heads.read_all) within float32 rounding.
"""
from __future__ import annotations

import numba
import numpy as np

from adalayers.infer import kernel_threads  # noqa: F401  (numba's threading layer: llama.cpp's OpenMP team)
from adalayers.infer.fast_exp import exp_neg


@numba.njit(nogil=True, cache=True, error_model="numpy", parallel=True)
def extend(qkv, rows, scale, q, kk, v, m, l, a, t):
    """Positions t..t+n-1 join the state. Their projections are rows `rows` (n of them, int64, in order) of qkv
    (H, N, 3k: q, k, v side by side, each nh attention heads of dh), written into q (times scale, dh^-1/2), kk
    and v (each (H, nh, dh, cap), float32: a feature's values over the positions side by side, so that the
    loops over positions vectorise); then the first t queries take the n new keys, one key after the other, and
    the n new queries take all t + n keys. m, l (H, nh, cap, float64) and a (H, nh, dh, cap, float32) updated in
    place. Scores, maxima and sums are float64 (over the long texts of a generation the state is rescaled once a
    step); the exponentials are float32 (fast_exp.exp_neg, inline). The (head, attention head) pairs are split
    among the calling thread's numba threads (kernel_threads.use); each pair's arithmetic is the same whatever
    the split."""
    H, nh, dh = q.shape[0], q.shape[1], q.shape[2]
    k, n = nh * dh, rows.size
    for hg in numba.prange(H * nh):
        h, g = hg // nh, hg % nh
        for r in range(n):
            for c in range(dh):
                col = g * dh + c
                q[h, g, c, t + r] = qkv[h, rows[r], col] * scale
                kk[h, g, c, t + r] = qkv[h, rows[r], k + col]
                v[h, g, c, t + r] = qkv[h, rows[r], 2 * k + col]
        _extend_pair(q, kk, v, m, l, a, t, n, h, g, np.empty(t + n, np.float64), np.empty(t + n, np.float32),
                     np.empty(t, np.float32))


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _extend_pair(q, kk, v, m, l, a, t, n, h, g, s, e, rescale):
    """extend for head h's attention head g, with scratch s (t + n, float64), e (t + n), rescale (t)."""
    dh = q.shape[2]
    for j in range(t, t + n):  # a new key joins the old queries' states
        s[:t] = 0.0
        for c in range(dh):
            kc = np.float64(kk[h, g, c, j])
            for i in range(t):
                s[i] += q[h, g, c, i] * kc
        for i in range(t):
            top = max(m[h, g, i], s[i])
            rescale[i] = exp_neg(np.float32(m[h, g, i] - top))
            e[i] = exp_neg(np.float32(s[i] - top))
            m[h, g, i] = top
            l[h, g, i] = l[h, g, i] * rescale[i] + e[i]
        for c in range(dh):
            vc = v[h, g, c, j]
            for i in range(t):
                a[h, g, c, i] = a[h, g, c, i] * rescale[i] + e[i] * vc
    for i in range(t, t + n):  # a new query over every key
        s[:] = 0.0
        for c in range(dh):
            qc = np.float64(q[h, g, c, i])
            for j in range(t + n):
                s[j] += qc * kk[h, g, c, j]
        top = -np.inf
        for j in range(t + n):
            top = max(top, s[j])
        for j in range(t + n):
            e[j] = exp_neg(np.float32(s[j] - top))
        for c in range(dh):
            a[h, g, c, i] = _dot(e, v[h, g, c], t + n)
        m[h, g, i], l[h, g, i] = top, sum64(e, t + n)


# the sums below are reassociated so that the compiler vectorises them (partial sums side by side); only they are
# compiled so: the exponentials keep their order of operations (fast_exp's two-part ln 2 depends on it)
@numba.njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def _dot(x, y, n):
    """sum_j x[j] y[j] over j < n, in float64."""
    total = 0.0
    for j in range(n):
        total += np.float64(x[j]) * np.float64(y[j])
    return total


@numba.njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def sum64(x, n):
    """sum_j x[j] over j < n, in float64 (read_kernel's mean pooling too)."""
    total = 0.0
    for j in range(n):
        total += np.float64(x[j])
    return total
