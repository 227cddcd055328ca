"""llama.cpp as a runtime: a GGUF base run quantized by llama.cpp, every layer's state read during its own pass.

    base = LlamaCpp(Path("gemma-3-270m-q4_k_m.gguf"))
    logits = base.decode([[2, 651, 2870]], taps=[tap])      # tap(i, Z_i) for i = 0..n_layer, Z_i (1, 3, d)

llama.cpp calls a callback for every tensor its scheduler computes (`cb_eval` in llama_context_params,
the mechanism behind its own eval-callback, imatrix and cvector tools): first asking "do you want this
node?" (ask=true), then, for the wanted ones, handing over the computed tensor (ask=false). The model
graphs name their layer outputs, and those names map onto the states transformers reports:

    state 0        inp_scaled (Gemma: the embeddings times sqrt(d)), else inp_embd / embd (the embedding rows)
    state i        l_out-(i-1), layer i-1's output, for i = 1 .. n_layer-1
    state n_layer  result_norm, the final norm's output (transformers' last hidden state)

llama.cpp's own l_out-(n_layer-1) (the last layer before the norm) has no counterpart in transformers'
states and is not read. The last layer computes only the rows whose outputs are asked for (a get_rows on
inp_out_ids), so a pass whose heads read the final state asks for outputs at every position.

llama.cpp asks about every node of every step (about 750 for Gemma 3 270M): the asking is answered by a
compiled filter (adalayers.infer.llamacpp_filter, numba) from a table of the wanted nodes' names, and only
those nodes' data enter Python (StateReader.on_data), none at all in a step without taps.

Returning false from the data callback ends the graph there: after the deepest state any head needs,
the rest of the graph (LM head included) is skipped (early exit, as Backbone's stop_after).
"""
from __future__ import annotations

import ctypes
import logging
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

from adalayers.errors import DataError, ModelError

log = logging.getLogger(__name__)
Tap = Callable[[int, torch.Tensor], None]

GGML_TYPE_F32 = 0
# state 0 candidates, in order of preference: Gemma's scaled embeddings, then the embedding rows (named
# inp_embd, or embd by the token-input path of this llama.cpp)
EMBEDDING_NAMES = (b"inp_scaled", b"inp_embd", b"embd")
_LAYER = re.compile(rb"l_out-(\d+)\Z")


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
    """

    def __init__(self, names: StateNames, d: int):
        self.names, self.d = names, d
        self.wanted: set[int] = set()
        self.stop_after: int | None = None
        self.sink: Callable[[int, np.ndarray], None] | None = None
        self.n_tokens = 0
        self.seen: set[int] = set()
        self.error: BaseException | None = None
        self._held: dict[bytes, np.ndarray] = {}
        self._index = {n: names.index(n) for n in names.candidates()}
        self.filter = _filter().NodeFilter(list(self._index), _NAME_OFFSET, self)  # held as long as the context
        self.callback = _lib().ggml_backend_sched_eval_callback(self.filter.address)

    def start(self, n_tokens: int, wanted: set[int], sink, stop_after: int | None) -> None:
        """A decode begins: the filter answers yes for the wanted states' nodes (state 0's too when state 1 is)."""
        self.n_tokens, self.wanted, self.sink, self.stop_after = n_tokens, wanted, sink, stop_after
        self.seen, self.error, self._held = set(), None, {}
        self.filter.set_answers([i in wanted or i == 0 and 1 in wanted for i in self._index.values()])

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
        if 0 in self.wanted and 0 not in self.seen and self._held:
            self._emit(0, self._embedding())
        top = self.names.n_layer if self.stop_after is None else self.stop_after
        missing = sorted(i for i in self.wanted if i <= top and i not in self.seen)
        if missing:
            raise ModelError(f"llama.cpp's graph did not name the states {missing} as adalayers expects "
                             "(inp_scaled/inp_embd/embd, l_out-N, result_norm): this model's architecture is not "
                             "supported by the llama.cpp runtime; use the default runtime")

    def _embedding(self) -> np.ndarray:
        return next(self._held[n] for n in EMBEDDING_NAMES if n in self._held)

    def _emit(self, i: int, rows: np.ndarray) -> None:
        self.seen.add(i)
        if i in self.wanted:
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


@dataclass
class Row:
    """One sequence's tokens in a decode: appended to sequence `seq` at positions start, start+1, ..."""
    tokens: Sequence[int]
    seq: int
    start: int = 0


class LlamaCpp:
    """A GGUF file loaded by llama.cpp (CPU), with its states read through StateReader.

    One context holds up to `n_seq` sequences (one KV cache, unified); a decode takes several rows,
    one sequence each, in one llama_batch, so several prompts (or decode steps) run as one batch.
    """

    def __init__(self, path: Path, n_ctx: int = 4096, n_seq: int = 8, n_batch: int = 2048, threads: int | None = None,
                 read_states: bool = True):
        """read_states=False: no eval callback at all (llama.cpp alone, for comparisons); taps then get nothing."""
        lib = _lib()
        if read_states:
            _filter()  # numba, before anything is loaded
        path = Path(path).expanduser()
        if not path.is_file():
            raise ModelError(f"GGUF file not found: {path}")
        from adalayers.model.gguf_models import check_header

        check_header(path)
        _quiet(lib)
        lib.llama_backend_init()
        mparams = lib.llama_model_default_params()
        mparams.n_gpu_layers = 0
        cpu = sorted((Path(lib.__file__).parent / "lib").glob("libggml-cpu.*"))  # AMX weight buffers crash
        if cpu and getattr(ctypes.CDLL(str(cpu[0])), "ggml_cpu_has_amx_int8", lambda: 0)():  # llama_decode on K-quants
            mparams.use_extra_bufts = False  # (llama.cpp issue 20824): none, as llama-server's --no-repack
        self.model = lib.llama_model_load_from_file(str(path).encode(), mparams)
        if not self.model:
            raise ModelError(f"llama.cpp cannot load {path}")
        self.n_layer = int(lib.llama_model_n_layer(self.model))
        self.d = int(lib.llama_model_n_embd(self.model))
        self.n_vocab = int(lib.llama_vocab_n_tokens(lib.llama_model_get_vocab(self.model)))
        self.n_params = int(lib.llama_model_n_params(self.model))
        self.reader = StateReader(StateNames(self.n_layer), self.d) if read_states else None
        cparams = lib.llama_context_default_params()
        cparams.n_ctx, cparams.n_batch, cparams.n_ubatch, cparams.n_seq_max = n_ctx, n_batch, n_batch, n_seq
        cparams.kv_unified = True
        cparams.no_perf = True
        if threads:
            cparams.n_threads = cparams.n_threads_batch = threads
        if read_states:
            cparams.cb_eval, cparams.cb_eval_user_data = self.reader.callback, self.reader.filter.user_data
        self.read_states = read_states
        self.ctx = lib.llama_init_from_model(self.model, cparams)
        if not self.ctx:
            lib.llama_model_free(self.model)
            raise ModelError(f"llama.cpp cannot make a context for {path} (n_ctx {n_ctx}, {n_seq} sequences)")
        self.n_ctx, self.n_seq, self.n_batch = n_ctx, n_seq, n_batch
        self.memory = lib.llama_get_memory(self.ctx)
        self._batch = lib.llama_batch_init(n_batch, 0, 1)
        self._free = list(range(n_seq))  # sequence ids not held by a pass or a generation
        self._returned: list[int] = []   # given back, KV cache not yet removed (see release)
        self._lock = threading.Lock()

    def acquire(self, n: int) -> list[int]:
        """n sequence ids of the context for one caller (a pass, or a generation across its steps)."""
        with self._lock:
            self._forget_returned()
            if n > len(self._free):
                raise ModelError(f"the llama.cpp context has {len(self._free)} of its {self.n_seq} sequences free, "
                                 f"{n} asked for")
            ids, self._free = self._free[:n], self._free[n:]
            return ids

    def truncate(self, keep: dict[int, int]) -> None:
        """Drop the KV cache of each sequence from position keep[seq] on."""
        with self._lock:
            for seq, pos in keep.items():
                _lib().llama_memory_seq_rm(self.memory, seq, pos, -1)

    def release(self, ids: list[int]) -> None:
        """Give these sequences back. Their KV cache is removed by the next acquire or decode, never here: a
        release may come from a garbage-collected generation, on any thread, even while a decode runs."""
        self._returned.extend(ids)  # list.extend is atomic under the GIL

    @property
    def free_sequences(self) -> int:
        """Sequence ids neither a pass nor a generation holds (given back ones included)."""
        return len(self._free) + len(self._returned)

    def _forget_returned(self) -> None:
        lib = _lib()
        while self._returned:
            i = self._returned.pop()
            lib.llama_memory_seq_rm(self.memory, i, -1, -1)
            self._free.append(i)

    @property
    def num_states(self) -> int:
        """States the heads can read: the embedding output, layers 1..n_layer-1, the final norm."""
        return self.n_layer + 1

    def decode(self, rows: list[Row], taps: Sequence[Callable[[int, np.ndarray], None]] = (),
               wanted: set[int] | None = None, outputs: str = "last", stop_after: int | None = None) -> np.ndarray | None:
        """Run the rows as one llama_batch. Each wanted state goes to every tap as (total tokens, d), the rows'
        tokens one after another in order. -> the next-token logits at each row's last token (rows, vocab),
        or None when the pass stopped early. outputs="all" asks for every position's output (needed for the
        last states of all positions; costs the LM head on every token)."""
        lib = _lib()
        n = sum(len(r.tokens) for r in rows)
        if n == 0:
            raise DataError("nothing to decode")
        if n > self.n_batch:
            raise DataError(f"{n} tokens in one llama.cpp batch; at most {self.n_batch}")
        if any(r.seq >= self.n_seq for r in rows):
            raise DataError(f"a sequence id beyond the {self.n_seq} the llama.cpp context holds")
        if taps and not self.read_states:
            raise ModelError("this llama.cpp context was made without its eval callback (read_states=False)")
        wanted = set(range(self.num_states)) if wanted is None else wanted

        def sink(i, z):
            for tap in taps:
                tap(i, z)

        with self._lock:  # one decode at a time: the batch, the reader and the context are shared
            self._forget_returned()
            last = self._fill(rows, outputs)
            if self.reader is not None:
                self.reader.start(n, wanted if taps else set(), sink, stop_after)
            code = lib.llama_decode(self.ctx, self._batch)
            if self.reader is not None:
                self.reader.finish()
            if code != 0:
                raise ModelError(f"llama_decode failed (code {code}): the KV cache may be full (n_ctx {self.n_ctx})")
            if stop_after is not None:
                return None
            outs = np.empty((len(rows), self.n_vocab), np.float32)
            for j, pos in enumerate(last):
                ptr = lib.llama_get_logits_ith(self.ctx, pos)  # by the token's index in the batch
                outs[j] = np.ctypeslib.as_array(ptr, (self.n_vocab,))
            return outs

    def _fill(self, rows: list[Row], outputs: str) -> list[int]:
        """Write the rows into the llama_batch; -> the batch index of each row's last token."""
        b, k, last = self._batch, 0, []
        for r in rows:
            for j, tok in enumerate(r.tokens):
                b.token[k], b.pos[k], b.n_seq_id[k] = int(tok), r.start + j, 1
                b.seq_id[k][0] = r.seq
                b.logits[k] = outputs == "all" or j == len(r.tokens) - 1
                k += 1
            last.append(k - 1)
        b.n_tokens = k
        return last

    def close(self) -> None:
        lib = _lib()
        if getattr(self, "_batch", None) is not None:
            lib.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "ctx", None):
            lib.llama_free(self.ctx)
            self.ctx = None
        if getattr(self, "model", None):
            lib.llama_model_free(self.model)
            self.model = None

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001  (interpreter shutdown)
            pass


def end_of_generation(engine: LlamaCpp) -> set[int]:
    """The vocabulary's end-of-generation tokens as llama.cpp reads them from the GGUF (eos, eot)."""
    lib = _lib()
    vocab = lib.llama_model_get_vocab(engine.model)
    return {int(t) for t in (lib.llama_vocab_eos(vocab), lib.llama_vocab_eot(vocab)) if int(t) >= 0}


_LOG_CALLBACK = None


def _quiet(lib) -> None:
    """llama.cpp's own log lines go to this module's logger at debug level (not to stderr)."""
    global _LOG_CALLBACK
    if _LOG_CALLBACK is None:
        def relay(level, text, _user):
            log.debug("llama.cpp: %s", (text or b"").decode("utf-8", "replace").rstrip())
        _LOG_CALLBACK = lib.llama_log_callback(relay)
        lib.llama_log_set(_LOG_CALLBACK, ctypes.c_void_p(0))
