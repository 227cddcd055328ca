"""Online-softmax attention state of one sequence, extended by new positions, compiled (numba).

A sequence head's self-attention sees the whole text, so each new position changes every earlier query's
output. Per head h, attention head g and query i the state is the running max m, the sum l and the
accumulated values A (numpy_incremental's module doc):

    s_ij = q_i . k_j                     (q already scaled by dh^-1/2)
    m_i' = max(m_i, max_j s_ij)          over the new keys j
    l_i' = l_i e^(m_i - m_i') + sum_j e^(s_ij - m_i')
    A_i' = A_i e^(m_i - m_i') + sum_j e^(s_ij - m_i') v_j

and a new query starts from m = -inf, l = 0, A = 0 over every key so far (the new ones included). Its output
is A_i / l_i. numpy's batched products over (heads, attention heads) of 8-wide rows ran ~40 tiny products and
a dozen passes over the state a sequence and step (0.24 ms at 130 positions, three heads of configs/cola.yaml);
this is one loop nest, a few microseconds a decode step. tests/test_numpy_incremental.py holds the reads to the
full read (numpy_heads.read_all) within float32 rounding.
"""
from __future__ import annotations

import numba
import numpy as np


@numba.njit(nogil=True, cache=True, error_model="numpy")
def extend(q, kk, v, m, l, a, t, n):
    """Positions t..t+n-1, already written into q, kk, v (each (H, nh, cap, dh), float32), join the state: the
    first t queries take the n new keys, the n new queries take all t + n keys. m, l (H, nh, cap, float64) and
    a (H, nh, cap, dh, float32) updated in place. Scores, maxima and sums are float64 (over the long texts of a
    generation the state is rescaled once a step)."""
    H, nh, _, dh = q.shape
    s = np.empty(t + n, np.float64)
    acc = np.empty(dh, np.float64)
    for h in range(H):
        for g in range(nh):
            for i in range(t):
                top = m[h, g, i]
                for j in range(n):
                    x = 0.0
                    for c in range(dh):
                        x += q[h, g, i, c] * kk[h, g, t + j, c]
                    s[j] = x
                    top = max(top, x)
                if top > m[h, g, i]:  # one exponential of the two is e^0 = 1 at a one-token step
                    scale = np.float64(np.exp(np.float32(m[h, g, i] - top)))
                    total = l[h, g, i] * scale
                    for c in range(dh):
                        a[h, g, i, c] *= scale
                else:
                    total = l[h, g, i]
                for j in range(n):
                    p = np.float64(np.exp(np.float32(s[j] - top)))
                    total += p
                    for c in range(dh):
                        a[h, g, i, c] += p * v[h, g, t + j, c]
                m[h, g, i], l[h, g, i] = top, total
            for i in range(t, t + n):
                top = -np.inf
                for j in range(t + n):
                    x = 0.0
                    for c in range(dh):
                        x += q[h, g, i, c] * kk[h, g, j, c]
                    s[j] = x
                    top = max(top, x)
                total = 0.0
                acc[:] = 0.0
                for j in range(t + n):
                    p = np.float64(np.exp(np.float32(s[j] - top)))
                    total += p
                    for c in range(dh):
                        acc[c] += p * v[h, g, j, c]
                for c in range(dh):
                    a[h, g, i, c] = acc[c]
                m[h, g, i], l[h, g, i] = top, total


@numba.njit(nogil=True, cache=True)
def outputs(l, a, t, out, at):
    """Every position's attention output A / l, the attention heads side by side: out[h, at + i, g dh + c] for
    i < t (out (H, rows, nh dh), the rows of several sequences one after another)."""
    H, nh, _, dh = a.shape
    for h in range(H):
        for i in range(t):
            for g in range(nh):
                for c in range(dh):
                    out[h, at + i, g * dh + c] = a[h, g, i, c] / l[h, g, i]
