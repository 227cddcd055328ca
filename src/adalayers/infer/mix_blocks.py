"""A prefill's layer mix of one layer, its rows in blocks on every thread of the team (numba around BLAS).

LayerMix.add(i, Z_i) for the H heads of one group that read layer i (width k each, their W_i^T side by side in
w_t, d x H k), over the n rows of a pass:

    a_r   = GELU(Z_ir)                       (once a layer: the first group's call writes it, the others read it)
    y_r   = a_r w_t                          (cblas_sgemm of numpy's OpenBLAS, infer/blas.py: one product a block)
    acc_r,live_h += w_h LayerNorm_noaffine(y_r,h)   (y_r,h: columns h k .. (h+1) k; mean and variance in float64)

numpy's way (layer_mix.LayerMix's fallback) is a GELU, one matmul and a LayerNorm of several passes, all on the
calling thread: the server holds OpenBLAS to one thread, since its own threads would compete with llama.cpp's, so
during a prefill the mix ran on one core while llama.cpp's other threads spun in the eval callback. Here the rows
go a block at a time (block_rows), the blocks split among the calling thread's numba threads (llama.cpp's OpenMP
team, infer/kernel_threads.py), each block's GELU, product and LayerNorm done by the thread that took it: a
512-token prompt of gemma3-270m on 2 threads spent 47 ms in four heads' mix against numpy's 71
(benchmarks/prefill_mix.py, docs/llm.md). tests/test_mix_blocks.py holds it to numpy's way. Blocks depend on the
number of rows alone, so the result is the same to the bit on any number of threads.
"""
from __future__ import annotations

import numba
import numpy as np

from adalayers.infer import kernel_threads  # noqa: F401  (numba's threading layer: llama.cpp's OpenMP team)
from adalayers.infer.blas import NO_TRANS, ROW_MAJOR
from adalayers.infer.gelu_kernel import gelu_kernel
from adalayers.infer.online_softmax import sum64

EPS = 1e-5  # numpy_heads.EPS, torch's LayerNorm default
BLOCK = 64  # rows of a block, one product each (each product packs w_t again: fewer rows cost more a row)


@numba.njit(nogil=True, cache=True, error_model="numpy", parallel=True)
def mix_blocks(z, a, have_a, w_t, w, live, acc, sgemm):
    """z (n, d) float32 (layer i's states), a (n, d) float32: GELU(z), written here unless have_a (an earlier
    group's call of the same layer wrote it); w_t (d, H k) C-contiguous, w (H,) the heads' layer weights, live (H,)
    int64 their places in acc (n, heads of the group, k) float32, added to; sgemm: blas.sgemm()."""
    n, d = z.shape
    m, k = w_t.shape[1], acc.shape[2]
    rows = block_rows(n)
    for b in numba.prange((n + rows - 1) // rows):
        lo, hi = b * rows, min(n, (b + 1) * rows)
        if not have_a:
            for r in range(lo, hi):
                gelu_kernel(z[r], a[r])
        y = np.empty((hi - lo, m), np.float32)
        sgemm(ROW_MAJOR, NO_TRANS, NO_TRANS, hi - lo, m, d, np.float32(1.0), a[lo:].ctypes, d, w_t.ctypes, m,
              np.float32(0.0), y.ctypes, m)
        for r in range(hi - lo):
            for h in range(live.size):
                if w[h] == 0.0:  # a head of the group that does not read this layer (add_layers' stack)
                    continue
                yh, out = y[r, h * k:(h + 1) * k], acc[lo + r, live[h]]
                mean = sum64(yh, k) / k
                scale = w[h] / np.sqrt(_squares64(yh, mean, k) / k + EPS)
                for o in range(k):
                    out[o] += np.float32((yh[o] - mean) * scale)


@numba.njit(nogil=True, cache=True)
def block_rows(n):
    """Rows of a block for n rows: BLOCK, or half of n where n < 2 BLOCK (at least 16), so that a pass of 64
    tokens (gguf_steps.OUTPUTS_AT_ONCE) still runs on two threads. It depends on n alone, never on threads."""
    return max(16, min(BLOCK, (n + 1) // 2))


@numba.njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def _squares64(x, mean, n):
    """sum_j (x[j] - mean)^2 over j < n, in float64 (reassociated, as online_softmax.sum64, so it vectorises)."""
    total = 0.0
    for j in range(n):
        total += (np.float64(x[j]) - mean) ** 2
    return total
