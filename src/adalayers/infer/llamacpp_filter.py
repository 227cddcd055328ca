"""llama.cpp's eval callback with its node filter compiled: only the wanted graph nodes reach Python.

llama.cpp's scheduler asks the callback about every node of the graph (ask=true: about 750 nodes a decode
step for Gemma 3 270M), then hands over each node it said yes to, once computed (ask=false). The asking is
answered here, in a numba cfunc of the ggml_backend_sched_eval_callback signature
bool (*)(struct ggml_tensor * t, bool ask, void * user_data), from the NodeFilter's table that user_data
points to:

    ask=true   the node's name (the bytes at t + name_offset, NUL-terminated) found in the table's rows
               -> that row's answer; not found -> false. No Python, no allocation.
    ask=false  the filter's owner.on_data(t), through one module-level ctypes callback: the Python data
               path, entered only for the nodes answered yes.

The cfunc calls that ctypes callback through its address, which numba freezes into the machine code: it is
compiled once per process (under a second, most of it numba's own start; a cache on disk cannot hold the
address, so there is none).
"""
from __future__ import annotations

import ctypes
import weakref
from typing import Protocol, Sequence

import numba
import numpy as np
from numba import types

from adalayers.errors import ModelError

ROW = 64  # GGML_MAX_NAME: a node name is at most 63 bytes and a NUL


class DataPath(Protocol):
    def on_data(self, t: int) -> bool:
        """A wanted node computed: t is its struct ggml_tensor *; false ends llama.cpp's graph there."""


_OWNERS: weakref.WeakValueDictionary[int, DataPath] = weakref.WeakValueDictionary()  # by user_data


def _on_data(t: int, ask: bool, user: int) -> bool:
    owner = _OWNERS.get(user)
    return owner is not None and owner.on_data(t)


# ggml_backend_sched_eval_callback: bool (*)(struct ggml_tensor * t, bool ask, void * user_data)
_ON_DATA = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p)(_on_data)
_COMPILED: dict[int, object] = {}


class NodeFilter:
    """The eval callback for one llama.cpp context: `address` (cb_eval) and `user_data` (cb_eval_user_data).

    user_data is this filter's table, rows of ROW bytes: row 0 holds n, the number of names (int64, its
    first 8 bytes); row r = 1..n a node name, NUL-padded, and in its last byte the answer (1: wanted). The
    rows never move: the answers are rewritten in place between decodes (set_answers). The owner is held
    weakly; keep this filter as long as the context."""

    def __init__(self, names: Sequence[bytes], name_offset: int, owner: DataPath):
        if any(len(n) > ROW - 2 for n in names):
            raise ModelError(f"llama.cpp node names have at most {ROW - 2} bytes here: {max(names, key=len)!r}")
        self.rows = np.zeros((1 + len(names), ROW), np.uint8)
        self.rows[0, :8] = np.frombuffer(np.int64(len(names)).tobytes(), np.uint8)
        for r, name in enumerate(names, 1):
            self.rows[r, :len(name)] = np.frombuffer(name, np.uint8)
        self.user_data = ctypes.c_void_p(self.rows.ctypes.data)
        _OWNERS[self.rows.ctypes.data] = owner
        if name_offset not in _COMPILED:
            _COMPILED[name_offset] = _compile(name_offset)
        self.address: int = _COMPILED[name_offset].address

    def set_answers(self, wanted: Sequence[bool]) -> None:
        """The answer for every name, in the order they were given."""
        self.rows[1:, ROW - 1] = np.asarray(wanted, np.uint8)


def _compile(name_offset: int):
    end = name_offset + ROW

    @numba.cfunc(types.boolean(types.voidptr, types.boolean, types.voidptr), nopython=True)
    def answer(t, ask, user):
        if not ask:
            return _ON_DATA(t, ask, user)
        n = numba.carray(user, (1,), np.int64)[0]
        table = numba.carray(user, (n + 1, ROW), np.uint8)
        node = numba.carray(t, (end,), np.uint8)
        for r in range(1, n + 1):
            j = 0
            while j < ROW - 1 and table[r, j] != 0 and table[r, j] == node[name_offset + j]:
                j += 1
            if j < ROW - 1 and table[r, j] == 0 and node[name_offset + j] == 0:
                return table[r, ROW - 1] != 0
        return False

    return answer
