"""A decode step's layer mix of a few rows in one compiled call (numba): LayerMix.add_layers where n is small.

For the heads of one group (H heads of width k) and the states Z of layers l = 1..L of n rows:

    a_lr  = GELU(Z_lr)                                (gelu_kernel, a row a call: each run of layers its own rows)
    f_lrh = LayerNorm_noaffine(a_lr W_lh^T)          (W_lh^T: columns h k .. (h+1) k of w_t[l], d x H k)
    acc_rh += sum_l w_lh f_lrh                        (w_lh: head h's weight of layer l, 0 where it does not read l)

numpy's path (a stacked (L, n, d) x (L, d, H k) product, a LayerNorm of a few passes, an einsum) is a dozen
calls on small arrays a step, each a pass over cold memory after llama.cpp's decode has streamed the model's
weights through the caches; here each W_l is read once, row after row of d, the n rows' products side by side
in a buffer that stays in L1, then normalised and summed in place. For n of a decode step (one row a
generating sequence) only; a prefill's hundreds of rows stay with the BLAS product (layer_mix.LayerMix).
The layers are summed LAYERS at a time, the runs in parallel on the calling thread's numba threads: after a
decode, llama.cpp's own OpenMP team, idle until the next one (infer/kernel_threads.py). A read of W is a read of
memory, so two cores read it in about two thirds of one core's time (0.85 -> 0.64 ms for three heads of k 64 over
19 states of 640 at one row, benchmarks/llamacpp_numpy_heads.py, docs/llm.md).
Float32 as numpy's path; LayerNorm's mean and variance in float64. tests/test_numpy_heads.py holds it to the
numpy path, which is held to torch's.
"""
from __future__ import annotations

import numba
import numpy as np

from adalayers.infer import kernel_threads  # noqa: F401  (numba's threading layer: llama.cpp's OpenMP team)
from adalayers.infer.gelu_kernel import gelu_kernel

EPS = 1e-5  # numpy_heads.EPS, torch's LayerNorm default
ROWS = 16   # LayerMix.add_layers mixes at most this many rows here, more with the BLAS product
LAYERS = 2  # layers a run of mix_rows sums (runs split among threads: 19 layers, 10 runs, 5 a thread on 2)


@numba.njit(nogil=True, cache=True, error_model="numpy", parallel=True)
def mix_rows(z, w_t, w, acc):
    """z (L, n, d) float32 (the states, GELU taken here), w_t (L, d, H k), w (L, H), acc (n, H, k) float32, added to.
    The layers are taken LAYERS at a time, each run summed on its own, the runs split among the calling thread's
    numba threads (kernel_threads.use); their sums are added to acc in order, so that the result is the same
    to the bit on any number of threads."""
    L = z.shape[0]
    runs = (L + LAYERS - 1) // LAYERS
    part = np.zeros((runs, acc.shape[0], acc.shape[1], acc.shape[2]), np.float32)
    for r in numba.prange(runs):
        _mix_layers(z, w_t, w, part[r], r * LAYERS, min((r + 1) * LAYERS, L))
    for r in range(runs):
        acc += part[r]


@numba.njit(nogil=True, cache=True, error_model="numpy")
def _mix_layers(z, w_t, w, acc, lo, hi):
    """acc += the mix of layers lo..hi-1 (mix_rows' formula)."""
    n, d = z.shape[1], z.shape[2]
    H, k = acc.shape[1], acc.shape[2]
    y = np.empty((n, H * k), np.float32)
    a = np.empty((n, d), np.float32)
    for li in range(lo, hi):
        for r in range(n):
            gelu_kernel(z[li, r], a[r])
        y[:] = 0.0
        for i in range(d):
            for r in range(n):
                x = a[r, i]
                for o in range(H * k):
                    y[r, o] += x * w_t[li, i, o]
        for r in range(n):
            for h in range(H):
                if w[li, h] == 0.0:
                    continue
                mean = 0.0
                for o in range(h * k, (h + 1) * k):
                    mean += y[r, o]
                mean /= k
                var = 0.0
                for o in range(h * k, (h + 1) * k):
                    var += (y[r, o] - mean) ** 2
                scale = w[li, h] / np.sqrt(var / k + EPS)
                for o in range(k):
                    acc[r, h, o] += np.float32((y[r, h * k + o] - mean) * scale)
