"""A prefill's layer mix in row blocks (infer/mix_blocks.py, the product by numpy's OpenBLAS through infer/blas.py)
against numpy's GELU, matmul and LayerNorm (LayerMix.add without the BLAS function, its fallback; both are held
to torch's mixer in tests/test_numpy_heads.py)."""
import ctypes

import numba
import numpy as np
import pytest

from adalayers.infer import blas, kernel_threads
from adalayers.infer.layer_mix import LayerMix
from adalayers.infer.mix_blocks import BLOCK
from test_numpy_heads import L, make, probe, to_numpy


def test_numpys_openblas_gives_its_sgemm():
    """numpy's wheels carry OpenBLAS: the fast path is the one these tests (and the server) run."""
    f = blas.sgemm()
    assert f is not None
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    b = np.arange(12, dtype=np.float32).reshape(3, 4)
    c = np.zeros((2, 4), np.float32)
    f(blas.ROW_MAJOR, blas.NO_TRANS, blas.NO_TRANS, 2, 4, 3, 1.0, a.ctypes.data, 3, b.ctypes.data, 4, 0.0,
      c.ctypes.data, 4)
    np.testing.assert_array_equal(c, a @ b)


def test_numpys_ilp64_openblas_is_chosen_even_where_scipys_is_listed_first(monkeypatch):
    """scipy.linalg loads SciPy's own OpenBLAS (LP64), which threadpoolctl may list before numpy's: the function is
    still numpy's ILP64 one (SciPy's, not held to one thread, ran a server at half speed under llama.cpp's team)."""
    pytest.importorskip("scipy.linalg")
    import threadpoolctl

    libs = [lib for lib in threadpoolctl.threadpool_info() if lib.get("internal_api") == "openblas"]
    numpys = [lib for lib in libs if getattr(ctypes.CDLL(lib["filepath"]), "scipy_cblas_sgemm64_", None) is not None]
    others = [lib for lib in libs if lib not in numpys]
    if not numpys or not others:
        pytest.skip("not numpy's ILP64 scipy-openblas beside SciPy's own here")
    monkeypatch.setattr(threadpoolctl, "threadpool_info", lambda: others + numpys)  # SciPy's first
    blas.sgemm.cache_clear()
    try:
        assert blas.sgemm().__name__ == "scipy_cblas_sgemm64_"
    finally:
        blas.sgemm.cache_clear()


def mixed(tasks, z, blocks: bool, monkeypatch, all_at_once: bool) -> list[np.ndarray]:
    with monkeypatch.context() as m:
        if not blocks:
            m.setattr(blas, "sgemm", lambda: None)
        mix = LayerMix(tasks)
        mix.begin(z.shape[1])
        if all_at_once:
            mix.add_layers(list(range(L)), z)
        else:
            for i in range(L):
                mix.add(i, z[i])
        return mix.take()


@pytest.mark.parametrize("all_at_once", [False, True])
@pytest.mark.parametrize("n", [1, 40, BLOCK, 2 * BLOCK + 7])
def test_row_blocks_equal_numpys_mix_and_the_same_bits_on_any_threads(n, all_at_once, monkeypatch):
    """Two groups (k 16 and 8) with layers under some head's cutoff (a group's live heads a subset; all at once,
    add_layers: weight 0 in the stack) and a probe group beside them (it reads the GELU the first group's call
    wrote): numpy's way within float32 rounding, and the same bits on 1 and 2 threads (the blocks do not depend on
    them). All at once, up to mix_kernel.ROWS rows go to mix_rows instead (tests/test_numpy_heads.py)."""
    tasks = [to_numpy(make("sequence", seed=s)) for s in range(3)] + [to_numpy(make("sequence", k=8, seed=3))]
    assert any(len(t.proj) < L for t in tasks)
    tasks.append(to_numpy(probe("sequence", 2, "mean", 6)))
    z = (np.random.default_rng(n).standard_normal((L, n, tasks[0].proj[next(iter(tasks[0].proj))].shape[1])) * 2
         ).astype(np.float32)
    want = mixed(tasks, z, False, monkeypatch, all_at_once)
    got = {}
    for threads in (1, 2):
        kernel_threads.use(threads)
        got[threads] = mixed(tasks, z, True, monkeypatch, all_at_once)
    kernel_threads.use(numba.config.NUMBA_NUM_THREADS)
    for a, b, c in zip(want, got[1], got[2]):
        np.testing.assert_allclose(b, a, atol=2e-5, rtol=0)
        np.testing.assert_array_equal(b, c)
