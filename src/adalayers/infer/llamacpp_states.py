"""llama.cpp's graph nodes read as hidden states: which node is which state (StateNames) and the eval callback
that reads them (StateReader), for adalayers.infer.llamacpp (see its docstring for the mapping).

No torch here: the torch-free serving path runs this module.
"""
from __future__ import annotations

import ctypes
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from adalayers.errors import ModelError

GGML_TYPE_F32 = 0
# state 0 candidates, in order of preference: Gemma's scaled embeddings, then the embedding rows (named
# inp_embd, or embd by the token-input path of this llama.cpp)
EMBEDDING_NAMES = (b"inp_scaled", b"inp_embd", b"embd")
_LAYER = re.compile(rb"l_out-(\d+)\Z")
GATHER_TOKENS = 64  # a pass of at most this many tokens is gathered by the compiled filter (StateReader)
POLL_SECONDS = 2e-4  # how often StateReader.ready looks at the filled marks (a gemma3-270m step: ~11 ms)


class _GgmlTensor(ctypes.Structure):
    """The head of ggml.h's struct ggml_tensor (GGML_MAX_DIMS 4, GGML_MAX_OP_PARAMS 64, GGML_MAX_SRC 10,
    GGML_MAX_NAME 64): type, buffer, ne, nb, op, op_params, flags, src, view_src, view_offs, data, name."""
    _fields_ = [("type", ctypes.c_int), ("buffer", ctypes.c_void_p), ("ne", ctypes.c_int64 * 4),
                ("nb", ctypes.c_size_t * 4), ("op", ctypes.c_int), ("op_params", ctypes.c_int32 * 16),
                ("flags", ctypes.c_int32), ("src", ctypes.c_void_p * 10), ("view_src", ctypes.c_void_p),
                ("view_offs", ctypes.c_size_t), ("data", ctypes.c_void_p), ("name", ctypes.c_char * 64)]


_NAME_OFFSET = _GgmlTensor.name.offset


def _filter():
    try:
        from adalayers.infer import llamacpp_filter
    except ImportError:
        raise ModelError("the llama.cpp runtime needs numba for its eval callback: "
                         "pip install 'adalayers[llamacpp]'") from None
    return llamacpp_filter


def _lib():
    try:
        import llama_cpp
    except ImportError:
        raise ModelError("the llama.cpp runtime needs llama-cpp-python: pip install 'adalayers[llamacpp]' "
                         "(pip compiles llama.cpp; see docs/llm.md)") from None
    return llama_cpp


_GGML = None


def _ggml() -> ctypes.CDLL:
    """ggml's base library, shipped beside libllama in llama-cpp-python, for the two backend calls needed."""
    global _GGML
    if _GGML is None:
        lib_dir = Path(_lib().__file__).parent / "lib"
        found = sorted(lib_dir.glob("libggml-base.*")) or sorted(lib_dir.glob("ggml-base.*"))
        if not found:
            raise ModelError(f"llama-cpp-python has no ggml-base library in {lib_dir}")
        ggml = ctypes.CDLL(str(found[0]))
        ggml.ggml_backend_buffer_is_host.argtypes, ggml.ggml_backend_buffer_is_host.restype = [ctypes.c_void_p], ctypes.c_bool
        ggml.ggml_backend_tensor_get.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t]
        ggml.ggml_backend_tensor_get.restype = None
        _GGML = ggml
    return _GGML


@dataclass
class StateNames:
    """Which graph node is which state, for a model of n_layer layers (see the module docstring)."""
    n_layer: int

    def index(self, name: bytes) -> int | None:
        """The state a node name holds, or None. inp_embd and inp_scaled both map to 0 (see StateReader)."""
        if name in EMBEDDING_NAMES:
            return 0
        if name == b"result_norm":
            return self.n_layer
        m = _LAYER.match(name)
        if m and int(m.group(1)) < self.n_layer - 1:
            return int(m.group(1)) + 1
        return None

    def candidates(self) -> list[bytes]:
        """Every node name that holds a state (index is not None)."""
        names = [*EMBEDDING_NAMES, *(f"l_out-{k}".encode() for k in range(self.n_layer)), b"result_norm"]
        return [n for n in names if self.index(n) is not None]


class StateReader:
    """The cb_eval callback: hands every wanted state, (tokens, d) as float32, to `sink(i, Z_i)` in layer order.

    Only the nodes whose state some tap needs are asked for (each asked node splits llama.cpp's graph
    compute), answered by the compiled filter (NodeFilter, its table the user_data), and the
    callback checks what it gets: F32, contiguous rows of d values, one row per token of the batch, in host
    memory (else copied out with ggml_backend_tensor_get). State 0 is held until layer 0's output arrives,
    since Gemma's graph names two candidates (the embedding rows, then inp_scaled) and the scaled one is
    transformers' state 0.

    A pass of at most GATHER_TOKENS tokens (a decode step) never enters Python inside the graph: the compiled
    filter copies each wanted node into a slot of a preallocated buffer (NodeFilter.set_gather; the context is
    CPU-only, so every node is in host memory), and finish() hands the states to the sink after the decode;
    `gathered` then holds them as views of that buffer (valid until the next decode). While such a decode
    runs, another thread may take each state as soon as it is copied (ready): the heads' work of a step then
    runs beside the rest of llama.cpp's graph (LlamaCpp.decode's `during`).
    """

    def __init__(self, names: StateNames, d: int):
        self.names, self.d = names, d
        self.wanted: set[int] = set()
        self.stop_after: int | None = None
        self.sink: Callable[[int, np.ndarray], None] | None = None
        self.n_tokens = 0
        self.seen: set[int] = set()
        self.error: BaseException | None = None
        self.gathered: dict[int, np.ndarray] = {}
        self._held: dict[bytes, np.ndarray] = {}
        self._index = {n: names.index(n) for n in names.candidates()}
        rank = {n: EMBEDDING_NAMES.index(n) if n in EMBEDDING_NAMES else 0 for n in self._index}
        self._rows_of: dict[int, list[int]] = {}  # state -> its table rows (state 0: preferred name first)
        for r, n in sorted(enumerate(self._index), key=lambda rn: rank[rn[1]]):
            self._rows_of.setdefault(self._index[n], []).append(r)
        f = _filter()
        layout = (_NAME_OFFSET, _GgmlTensor.ne.offset, _GgmlTensor.nb.offset, _GgmlTensor.data.offset)
        self.filter = f.NodeFilter(list(self._index), layout, self)  # held as long as the context
        self.callback = _lib().ggml_backend_sched_eval_callback(self.filter.address)
        self._buffer = np.zeros((len(self._index), GATHER_TOKENS * d), np.float32)
        self._gather = False

    def start(self, n_tokens: int, wanted: set[int], sink, stop_after: int | None) -> None:
        """A decode begins: the filter answers yes for the wanted states' nodes (state 0's too when state 1 is);
        a small pass (n_tokens <= GATHER_TOKENS) in gather mode."""
        self.n_tokens, self.wanted, self.sink, self.stop_after = n_tokens, wanted, sink, stop_after
        self.seen, self.error, self._held, self.gathered = set(), None, {}, {}
        self._gather = bool(wanted) and n_tokens <= GATHER_TOKENS
        if not self._gather:
            self.filter.set_answers([i in wanted or i == 0 and 1 in wanted for i in self._index.values()])
            return
        stop = None if stop_after is None else max(stop_after, 1)  # never at state 0 (inp_scaled may follow)
        slots = [r if i in wanted else None for r, i in enumerate(self._index.values())]
        stops = [stop is not None and i >= stop for i in self._index.values()]
        self.filter.set_gather(self._buffer, slots, stops, self.d, n_tokens)

    @property
    def gathering(self) -> bool:
        """The decode begun by start() is gathered by the compiled filter (no Python inside the graph)."""
        return self._gather

    def ready(self, i: int, ended: threading.Event) -> np.ndarray | None:
        """From another thread while a gathered decode runs: state i's rows (n_tokens, d), a view of the buffer
        valid until the next decode, as soon as the filter has copied them; None when the decode ended (`ended`
        set) without them (finish() then says why). State 0 is taken once its preferred name is copied, or a
        later state is (the embedding nodes come first in every graph), or the decode ended."""
        rows = self._rows_of.get(i, [])
        while True:
            over = ended.is_set()  # read before the marks: a decode that has ended has set every mark it will
            filled = self.filter.filled()
            got = [r for r in rows if filled[r]]
            if got and (i != 0 or got[0] == rows[0] or over
                        or any(filled[r] for j, rs in self._rows_of.items() if j > 0 for r in rs)):
                size = self.n_tokens * self.d
                return self._buffer[got[0], :size].reshape(self.n_tokens, self.d)
            if over:
                return None
            ended.wait(POLL_SECONDS)

    def on_data(self, t: int) -> bool:
        """A wanted node, computed (ask=false): its state goes to the sink; false ends the graph here."""
        try:
            name = ctypes.string_at(t + _NAME_OFFSET)
            return self._take(name, self._index[name], _GgmlTensor.from_address(t))
        except BaseException as e:  # noqa: BLE001  (never let an exception cross the C boundary)
            self.error = e
            return False

    def _take(self, name: bytes, i: int, t: _GgmlTensor) -> bool:
        rows = self._rows(name, t)
        if i == 0:
            self._held[name] = rows
            return True
        if 0 not in self.seen and self._held:
            self._emit(0, self._embedding())
        self._emit(i, rows)
        return self.stop_after is None or i < self.stop_after

    def finish(self) -> None:
        """After the decode: the states asked for all arrived (a graph that names its layers otherwise
        is refused), and an exception raised inside the callback is raised here."""
        if self.error is not None:
            raise self.error
        if self._gather:
            self._unload()
        if 0 in self.wanted and 0 not in self.seen and self._held:
            self._emit(0, self._embedding())
        top = self.names.n_layer if self.stop_after is None else self.stop_after
        missing = sorted(i for i in self.wanted if i <= top and i not in self.seen)
        if missing:
            raise ModelError(f"llama.cpp's graph did not name the states {missing} as adalayers expects "
                             "(inp_scaled/inp_embd/embd, l_out-N, result_norm): this model's architecture is not "
                             "supported by the llama.cpp runtime; use the default runtime")

    def _unload(self) -> None:
        """Gather mode: the filled slots, state 0 from the preferred embedding name, to `gathered` and the sink."""
        status = self.filter.status()
        if status is not None:
            raise ModelError(f"a llama.cpp state {status}")
        size = self.n_tokens * self.d
        views = {}
        for r, (name, filled) in enumerate(zip(self._index, self.filter.filled())):
            if filled:
                views.setdefault(self._index[name], []).append((name, self._buffer[r, :size].reshape(self.n_tokens, self.d)))
        if 0 in views:
            views[0] = [min(views[0], key=lambda nv: EMBEDDING_NAMES.index(nv[0]))]
        for i in sorted(views):
            self.gathered[i] = views[i][0][1]
            self._emit(i, self.gathered[i].copy() if self.sink is not None else None)  # a copy: the buffer is reused

    def _embedding(self) -> np.ndarray:
        return next(self._held[n] for n in EMBEDDING_NAMES if n in self._held)

    def _emit(self, i: int, rows: np.ndarray) -> None:
        self.seen.add(i)
        if i in self.wanted and self.sink is not None:
            self.sink(i, rows)

    def _rows(self, name: bytes, t: _GgmlTensor) -> np.ndarray:
        ne, nb = list(t.ne), list(t.nb)
        if t.type != GGML_TYPE_F32:
            raise ModelError(f"llama.cpp state {name.decode()} is not F32 (ggml type {t.type})")
        if ne[0] != self.d or ne[1] != self.n_tokens or ne[2] != 1 or ne[3] != 1:
            raise ModelError(f"llama.cpp state {name.decode()} has shape {ne}, expected [{self.d}, {self.n_tokens}, 1, 1]"
                             " (a batch split into several micro-batches, or another graph layout)")
        if nb[0] != 4 or nb[1] != 4 * self.d:
            raise ModelError(f"llama.cpp state {name.decode()} is not contiguous (strides {nb})")
        size = self.n_tokens * self.d
        if t.buffer and not _ggml().ggml_backend_buffer_is_host(t.buffer):  # e.g. a GPU buffer: copy it out
            out = np.empty((self.n_tokens, self.d), np.float32)
            _ggml().ggml_backend_tensor_get(ctypes.addressof(t), out.ctypes.data, 0, size * 4)
            return out
        return np.ctypeslib.as_array((ctypes.c_float * size).from_address(t.data)).reshape(self.n_tokens, self.d).copy()
