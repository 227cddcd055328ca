"""A sequence head's per-step read of its attention state, compiled (numba) around one BLAS product.

For one sequence and a group of H heads of width k (nh attention heads of dh features), from the online-softmax
state of its n positions (online_softmax.py: A (H, nh, dh, positions), l (H, nh, positions)):

    att_hj = A_hj / l_hj                                (head h's attention output at position j, k wide)
    y_hj   = W_o,h att_hj + b_o,h                       (the out-projection)
    out_h  = pool_j GELU(y_hj)                          (mean, max, first or last over the positions)

numpy's path was a dozen calls a sequence (the division, a stacked product, GELU, a reduceat a head), each a pass
over memory that llama.cpp's decode has just evicted. Here a step's read (numpy_incremental._Group.read) is
normalise() once a sequence (A / l into one array of every sequence's positions, features by positions: the
state's layout), one stacked product by W_o (numpy's BLAS: numba's np.dot would load SciPy, which the torch-free
server does not), then pool() once: GELU and each head's pooling in place, the (sequence, head, block of
features) items split among the calling thread's numba threads (kernel_threads.use), so that one sequence of
three heads keeps two threads busy. The mean is summed in float64.
tests/test_numpy_incremental.py holds the reads to the full read (numpy_heads.read_all) within float32 rounding.
"""
from __future__ import annotations

import numba
import numpy as np

from adalayers.infer import kernel_threads  # noqa: F401  (numba's threading layer: llama.cpp's OpenMP team)
from adalayers.infer.gelu_kernel import gelu_one
from adalayers.infer.online_softmax import sum64

BLOCK = 16  # output features a (sequence, head, block) item of pool() computes
POOLINGS = {"mean": 0, "max": 1, "first": 2, "last": 3}  # a head's pooling as the kernel's code


@numba.njit(nogil=True, cache=True, error_model="numpy", parallel=True)
def normalise(a, l, n, att, at):
    """att[:, :, at:at + n] = A / l of one sequence's n >= 1 positions: a (H, nh, dh, cap) float32, l (H, nh, cap)
    float64 (online_softmax's state), att (H, nh dh, P) float32; 1 / l rounded to float32 first, as numpy's path.
    The (head, attention head) pairs split among the calling thread's numba threads."""
    H, nh, dh = a.shape[0], a.shape[1], a.shape[2]
    for hg in numba.prange(H * nh):
        h, g = hg // nh, hg % nh
        lg = l[h, g, :n]  # slices: indices from 0, so that the loops vectorise
        inv = np.empty(n, np.float32)
        for j in range(n):
            inv[j] = np.float32(1.0 / lg[j])
        for c in range(dh):
            ac, row = a[h, g, c, :n], att[h, g * dh + c, at:at + n]
            for j in range(n):
                row[j] = ac[j] * inv[j]


@numba.njit(nogil=True, cache=True, error_model="numpy", parallel=True)
def pool(y, b_o, ends, pooling, out):
    """out[s, h] = pool_j GELU(y[h, :, j] + b_o[h]) over sequence s's positions ends[s]..ends[s + 1] - 1:
    y (H, k, P) float32 (W_o att, written over with GELU), b_o (H, k), ends (S + 1,) int64, pooling (H,) int64
    (POOLINGS), out (S, H, k) float32. The (sequence, head, block of BLOCK features) items split among the
    calling thread's numba threads; a first or last pooling takes its one position only."""
    H, k = y.shape[0], y.shape[1]
    S, blocks = ends.size - 1, (k + BLOCK - 1) // BLOCK
    for item in numba.prange(S * H * blocks):
        s, h, o0 = item // (H * blocks), item // blocks % H, item % blocks * BLOCK
        code = pooling[h]
        lo, hi = ends[s], ends[s + 1]
        lo, hi = (hi - 1, hi) if code == 3 else (lo, lo + 1 if code == 2 else hi)
        for o in range(o0, min(o0 + BLOCK, k)):
            yo, b = y[h, o, lo:hi], b_o[h, o]
            for j in range(hi - lo):
                yo[j] = gelu_one(yo[j] + b)
            if code == 1:
                top = yo[0]
                for j in range(1, hi - lo):
                    if yo[j] > top or yo[j] != yo[j]:  # NaN stays NaN (numpy's max), for the read's non-finite check
                        top = yo[j]
                out[s, h, o] = top
            else:
                out[s, h, o] = np.float32(sum64(yo, hi - lo) / (hi - lo))
