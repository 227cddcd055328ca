"""The server process's memory, reported by GET /health.

    rss_mb          resident set size of this process (/proc/self/status VmRSS)
    heap_in_use_mb  bytes the C allocator has handed out and not had back (glibc mallinfo2:
                    uordblks + hblkhd): tensors, tokenizer buffers, Python objects' blocks
    heap_free_mb    bytes freed but kept by the allocator for reuse (fordblks)

    gc_frozen       Python objects moved out of the garbage collector's view once the model was loaded
                    (freeze_loaded)

RSS that grows while heap_in_use_mb stays flat is memory freed and kept by the allocator (heap
fragmentation across its per-thread arenas), not a leak; heap_in_use_mb that keeps growing is.
Off Linux/glibc the values that cannot be read are None.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import gc
from pathlib import Path

_MIB = 2 ** 20


class _Mallinfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _mallinfo2():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallinfo2  # glibc >= 2.33
    except (OSError, AttributeError):
        return None
    fn.restype = _Mallinfo2
    return fn


_MALLINFO2 = _mallinfo2()


def rss_mb() -> float | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def process_memory() -> dict[str, float | None]:
    """{rss_mb, heap_in_use_mb, heap_free_mb} rounded to 0.1 MB, and gc_frozen."""
    info = _MALLINFO2() if _MALLINFO2 else None
    values = {"rss_mb": rss_mb(),
              "heap_in_use_mb": (info.uordblks + info.hblkhd) / _MIB if info else None,
              "heap_free_mb": info.fordblks / _MIB if info else None}
    return {**{k: None if v is None else round(v, 1) for k, v in values.items()}, "gc_frozen": gc.get_freeze_count()}


def freeze_loaded() -> int:
    """Once the model is loaded, move every object alive now out of the collector's view (gc.freeze, after one
    collection), and return how many. A loaded base, its heads and their libraries are some 440,000 Python objects
    that live as long as the server; a full collection walked them all, 0.3-0.8 s with the GIL held, stalling the
    event loop and every request in flight whenever enough request objects had survived to trigger one (issue 56:
    valid requests answered 0.2 s late together, every few seconds under load). Frozen objects are never
    collected, which these never would be anyway."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
