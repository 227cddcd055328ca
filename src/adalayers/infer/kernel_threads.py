"""The threads of the compiled per-step kernels (numba, parallel=True): llama.cpp's own OpenMP team, reused.

llama.cpp's CPU backend runs a decode on an OpenMP team of its `threads`; once the decode returns, the team's
other threads spin for a while waiting for the next parallel region. A decode step's head work (the layer mix,
the per-step reads) runs after the decode on the thread that called it; on that one thread it left the other
cores spinning idle, so the more threads llama.cpp used, the larger the heads' share of a step (docs/llm.md).
numba's `omp` threading layer is the same libgomp (both link the system's libgomp.so.1), so a parallel kernel
launched from the decode's thread is a parallel region of the same team: the spinning threads take their part
at once, and no second pool of threads competes with llama.cpp's.

    prefer_openmp()   at import: numba's threading layer tried in the order omp, tbb, workqueue, unless the
                      environment chose one (NUMBA_THREADING_LAYER, NUMBA_THREADING_LAYER_PRIORITY)
    use(threads)      the calling thread's kernels run on `threads` threads (numba's count is per thread):
                      llama.cpp's threads where they run after its decode, 1 beside it (LlamaCpp.beside);
                      LlamaCpp.decode sets it on its caller's thread, its side thread starts with 1; a llama.cpp
                      built without OpenMP (its system info without "OPENMP = 1") gets 1: its own thread pool is
                      no team these kernels could join, and a second one would compete with it

GNU OpenMP is not fork-safe: a child forked after these kernels ran is ended by numba's omp layer if it runs one
(llama.cpp's decode in such a child is no safer). Serving never forks; start worker processes with spawn, as
Ray and the lab's comparisons do.
"""
from __future__ import annotations

import os

import numba


def prefer_openmp() -> None:
    """numba's threading layer: OpenMP first (the team llama.cpp uses), where the environment has not chosen."""
    if not any(v in os.environ for v in ("NUMBA_THREADING_LAYER", "NUMBA_THREADING_LAYER_PRIORITY")):
        numba.config.THREADING_LAYER_PRIORITY = ["omp", "tbb", "workqueue"]


def use(threads: int) -> None:
    """The calling thread's parallel kernels run on `threads` threads (at least 1, at most numba's NUM_THREADS)."""
    n = max(1, min(int(threads), numba.config.NUMBA_NUM_THREADS))
    if numba.get_num_threads() != n:
        numba.set_num_threads(n)


prefer_openmp()
