"""numpy's own BLAS product as a function that compiled kernels call from their threads (numba, ctypes).

A prefill's layer mix (infer/mix_blocks.py) cuts its rows into blocks and runs a block's product on each of the
calling thread's numba threads: during a llama.cpp pass, llama.cpp's own OpenMP team, otherwise spinning in the
eval callback (infer/kernel_threads.py). numpy's matmul would run it on one thread: the server holds OpenBLAS to
one, because OpenBLAS' own threads would compete with llama.cpp's. The product is cblas_sgemm of the OpenBLAS
that numpy loaded (threadpoolctl names its file), called with one OpenBLAS thread per calling thread:

    f = sgemm()   # the ctypes function, or None where numpy's BLAS is not an OpenBLAS that exports it
    f(ROW_MAJOR, NO_TRANS, NO_TRANS, m, n, k, 1.0, a.ctypes, lda, b.ctypes, ldb, 0.0, c.ctypes, ldc)

numpy's wheels carry an ILP64 OpenBLAS (64-bit sizes, its symbols prefixed `scipy_` and suffixed `64_`); older
builds export the plain `cblas_sgemm` with 32-bit sizes. Where neither is found the callers keep numpy's matmul.
"""
from __future__ import annotations

import ctypes
import functools
import logging

log = logging.getLogger(__name__)

ROW_MAJOR, NO_TRANS = 101, 111  # CBLAS_ORDER.CblasRowMajor, CBLAS_TRANSPOSE.CblasNoTrans
# (symbol, its integer size type): the ILP64 names first, as numpy >= 2's wheels export them
SYMBOLS = [("scipy_cblas_sgemm64_", ctypes.c_int64), ("cblas_sgemm64_", ctypes.c_int64),
           ("scipy_cblas_sgemm", ctypes.c_int32), ("cblas_sgemm", ctypes.c_int32)]


@functools.cache
def sgemm():
    """cblas_sgemm of numpy's OpenBLAS as a ctypes function (numba kernels take it as an argument), or None.
    The ILP64 names first, in every OpenBLAS loaded: SciPy's (scipy.linalg loads its own, LP64, and threadpoolctl
    may list it first) is not the one the server held to one thread at load, and called from llama.cpp's OpenMP
    threads with its own threads on it ran a server at half its speed. An LP64 one is taken only where it runs
    one thread."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    import numpy  # noqa: F401  (its BLAS loaded, for threadpoolctl to see)

    libs = []
    for lib in threadpool_info():
        if lib.get("internal_api") == "openblas":
            try:
                libs.append((lib["filepath"], lib.get("num_threads"), ctypes.CDLL(lib["filepath"])))
            except OSError:
                continue
    for name, size in SYMBOLS:
        for path, threads, handle in libs:
            fn = getattr(handle, name, None)
            if fn is None or (size is ctypes.c_int32 and threads != 1):  # an LP64 one only where held to one
                continue
            fn.restype = None
            fn.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, size, size, size, ctypes.c_float,
                           ctypes.c_void_p, size, ctypes.c_void_p, size, ctypes.c_float, ctypes.c_void_p, size]
            log.debug("blas: %s of %s", name, path)
            return fn
    log.info("blas: numpy's BLAS exports no cblas_sgemm this code knows; a prefill's layer mix stays on numpy's "
             "matmul (one thread)")
    return None
