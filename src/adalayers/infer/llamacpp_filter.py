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

The cfunc calls that ctypes callback through its address, which the NodeFilter writes into its table's
header (H_CALLBACK) and the cfunc reads at call time: the machine code holds no address of this process,
so numba caches it on disk (cache=True), one entry per tensor layout, beside this file in __pycache__ or
where numba's own settings put it (NUMBA_CACHE_DIR; a user-wide cache dir if __pycache__ is read-only).
The first process compiles it (a few seconds), later ones load it; the cache is rebuilt when this file changes.

Gather mode (set_gather, a small pass such as a decode step): ask=false does not enter Python at all. The
node's rows are checked (F32, [d, n_tokens, 1, 1], contiguous) and copied into slot s of a preallocated
buffer (the row's slot byte), then the row marked filled (after a release fence: another thread may read the
slot as soon as it sees the mark, while the graph goes on); a row marked as the stop ends the graph there (false).
A check that fails records its code in the table's status and ends the graph; the owner raises it after the
decode (StateReader.finish).
"""
from __future__ import annotations

import ctypes
import weakref
from typing import Protocol, Sequence

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from adalayers.errors import ModelError

ROW = 64  # GGML_MAX_NAME: a node name is at most 63 bytes and a NUL
# the last bytes of a table row: the answer, the gather slot (NO_SLOT: none), the stop mark, the filled mark
ANSWER, SLOT, STOP, FILLED = ROW - 1, ROW - 2, ROW - 3, ROW - 4
NAME_BYTES = ROW - 5
NO_SLOT = 255
# the header (row 0) as int64: number of names, gather buffer address (0: off), floats per slot, d, tokens, status,
# the address of the ctypes callback for ask=false outside gather mode
H_N, H_BUFFER, H_SLOT_SIZE, H_D, H_TOKENS, H_STATUS, H_CALLBACK = range(7)
STATUS = {1: "is not F32", 2: "has another shape than [d, tokens, 1, 1] (a batch split into micro-batches?)",
          3: "is not contiguous"}


class DataPath(Protocol):
    def on_data(self, t: int) -> bool:
        """A wanted node computed: t is its struct ggml_tensor *; false ends llama.cpp's graph there."""


_OWNERS: weakref.WeakValueDictionary[int, DataPath] = weakref.WeakValueDictionary()  # by user_data


def _on_data(t: int, ask: bool, user: int) -> bool:
    owner = _OWNERS.get(user)
    return owner is not None and owner.on_data(t)


# ggml_backend_sched_eval_callback: bool (*)(struct ggml_tensor * t, bool ask, void * user_data)
_ON_DATA = ctypes.CFUNCTYPE(ctypes.c_bool, ctypes.c_void_p, ctypes.c_bool, ctypes.c_void_p)(_on_data)
_ON_DATA_ADDRESS: int = ctypes.cast(_ON_DATA, ctypes.c_void_p).value
_COMPILED: dict[tuple[int, int, int, int], object] = {}  # by layout


class NodeFilter:
    """The eval callback for one llama.cpp context: `address` (cb_eval) and `user_data` (cb_eval_user_data).

    user_data is this filter's table, rows of ROW bytes: row 0 the header (int64s: H_N the number of names,
    then the gather settings); row r = 1..n a node name, NUL-padded, and in its last bytes the answer (1:
    wanted), the gather slot, the stop and filled marks. The rows never move: the answers are rewritten in
    place between decodes (set_answers, set_gather); H_CALLBACK holds the ctypes callback's address, read by
    the cfunc at call time. The owner is held weakly; keep this filter as long as the context. `layout`: the
    byte offsets of ggml_tensor's name, ne, nb and data fields (type is at 0)."""

    def __init__(self, names: Sequence[bytes], layout: tuple[int, int, int, int], owner: DataPath):
        if any(len(n) > NAME_BYTES for n in names):
            raise ModelError(f"llama.cpp node names have at most {NAME_BYTES} bytes here: {max(names, key=len)!r}")
        self.rows = np.zeros((1 + len(names), ROW), np.uint8)
        self.header = self.rows[0].view(np.int64)  # a view: writes reach the table
        self.header[H_N] = len(names)
        self.header[H_CALLBACK] = _ON_DATA_ADDRESS
        for r, name in enumerate(names, 1):
            self.rows[r, :len(name)] = np.frombuffer(name, np.uint8)
        self.user_data = ctypes.c_void_p(self.rows.ctypes.data)
        _OWNERS[self.rows.ctypes.data] = owner
        self.address: int = compiled(layout).address

    def set_answers(self, wanted: Sequence[bool]) -> None:
        """The answer for every name, in the order they were given; gather mode off."""
        self.rows[1:, ANSWER] = np.asarray(wanted, np.uint8)
        self.header[H_BUFFER] = 0

    def set_gather(self, buffer: np.ndarray, slots: Sequence[int | None], stops: Sequence[bool], d: int,
                   n_tokens: int) -> None:
        """Gather mode for the next decode: name r's rows copied into buffer[slots[r]] (float32, C-contiguous,
        each slot at least n_tokens * d floats; None: not wanted), the graph ended after a name whose stop is set."""
        self.rows[1:, ANSWER] = [s is not None for s in slots]
        self.rows[1:, SLOT] = [NO_SLOT if s is None else s for s in slots]
        self.rows[1:, STOP] = np.asarray(stops, np.uint8)
        self.rows[1:, FILLED] = 0
        self.header[[H_SLOT_SIZE, H_D, H_TOKENS, H_STATUS]] = buffer.shape[1], d, n_tokens, 0
        self.header[H_BUFFER] = buffer.ctypes.data

    def filled(self) -> np.ndarray:
        """Per name: copied in the last gathered decode."""
        return self.rows[1:, FILLED].astype(bool)

    def status(self) -> str | None:
        """What the last gathered decode's check found wrong with a node (None: nothing)."""
        code = int(self.header[H_STATUS])
        return STATUS.get(code, f"status {code}") if code else None


def compiled(layout: tuple[int, int, int, int]):
    """The filter's numba cfunc for one tensor layout (see NodeFilter), made once per process: loaded from
    numba's cache on disk when there (its cache_hits then counts 1), else compiled and saved there."""
    if layout not in _COMPILED:
        _COMPILED[layout] = _compile(*layout)
    return _COMPILED[layout]


@intrinsic
def _pointer(typingctx, address):
    """An int64 address as a void pointer (numba.carray takes pointers only)."""
    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], cgutils.voidptr_t)
    return types.voidptr(types.int64), codegen


@intrinsic
def _call(typingctx, address, t, ask, user):
    """Call the eval callback at `address`, an int64 read at run time: bool (*)(void *, bool, void *), with
    the LLVM types numba gives a ctypes function of that signature (ExternalFuncPointerModel)."""
    def codegen(context, builder, signature, args):
        fn = ir.FunctionType(context.get_value_type(types.boolean),
                             [context.get_value_type(a) for a in signature.args[1:]])
        return builder.call(builder.inttoptr(args[0], fn.as_pointer()), args[1:])
    return types.boolean(types.int64, types.voidptr, types.boolean, types.voidptr), codegen


@intrinsic
def _release(typingctx):
    """A release fence: the slot's rows are visible to another thread before the filled mark that says so
    (StateReader.ready reads the marks while the decode runs)."""
    def codegen(context, builder, signature, args):
        builder.fence("release")
        return context.get_dummy_value()
    return types.none(), codegen


@numba.njit(inline="always")
def _read64(node, at):
    v = np.int64(0)
    for b in range(8):
        v |= np.int64(node[at + b]) << np.int64(8 * b)
    return v


def _compile(name_offset: int, ne_offset: int, nb_offset: int, data_offset: int):
    """The filter's cfunc for one tensor layout (its closure: these ints, which key numba's cache entry)."""
    end = max(name_offset + ROW, data_offset + 8, ne_offset + 32, nb_offset + 32)

    @numba.cfunc(types.boolean(types.voidptr, types.boolean, types.voidptr), nopython=True, cache=True)
    def answer(t, ask, user):
        header = numba.carray(user, (8,), np.int64)
        if not ask and header[H_BUFFER] == 0:
            return _call(header[H_CALLBACK], t, ask, user)
        n = header[H_N]
        table = numba.carray(user, (n + 1, ROW), np.uint8)
        node = numba.carray(t, (end,), np.uint8)
        row = -1
        for r in range(1, n + 1):
            j = 0
            while j < NAME_BYTES and table[r, j] != 0 and table[r, j] == node[name_offset + j]:
                j += 1
            if j < NAME_BYTES and table[r, j] == 0 and node[name_offset + j] == 0:
                row = r
                break
        if row < 0:
            return False
        if ask:
            return table[row, ANSWER] != 0
        d, tokens = header[H_D], header[H_TOKENS]  # gather mode: check, copy, mark
        if _read64(node, 0) & 0xFFFFFFFF != 0:
            header[H_STATUS] = 1
            return False
        if _read64(node, ne_offset) != d or _read64(node, ne_offset + 8) != tokens or \
                _read64(node, ne_offset + 16) != 1 or _read64(node, ne_offset + 24) != 1:
            header[H_STATUS] = 2
            return False
        if _read64(node, nb_offset) != 4 or _read64(node, nb_offset + 8) != 4 * d:
            header[H_STATUS] = 3
            return False
        size = d * tokens
        src = numba.carray(_pointer(_read64(node, data_offset)), (size,), np.float32)
        slot = np.int64(table[row, SLOT])
        dst = numba.carray(_pointer(header[H_BUFFER] + slot * header[H_SLOT_SIZE] * 4), (size,), np.float32)
        dst[:] = src
        _release()
        table[row, FILLED] = 1
        return table[row, STOP] == 0

    return answer
