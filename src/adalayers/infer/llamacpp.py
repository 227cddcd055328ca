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

A decode step's head work may run beside llama.cpp's own (decode's `during`, on a thread of its own): it takes
the states as the compiled filter copies them (StateReader.ready), while llama.cpp computes the later layers and
the LM head. That is worth it where llama.cpp leaves a core free (`beside`: more usable cores than its threads);
beside threads that use every core it delays them (measured: benchmarks/llamacpp_numpy_heads.py --overlap on|off,
served heads in docs/llm.md).
"""
from __future__ import annotations

import ctypes
import logging
import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from adalayers.errors import DataError, ModelError
from adalayers.infer.cores import default_threads, usable_cpus
from adalayers.infer.llamacpp_states import (EMBEDDING_NAMES, GATHER_TOKENS, StateNames, StateReader,  # noqa: F401
                                             _filter, _lib)

log = logging.getLogger(__name__)
Tap = Callable[[int, np.ndarray], None]  # no torch here: the torch-free serving path runs this module


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
                 read_states: bool = True, max_outputs: int | None = None, swa_full: bool = False,
                 overlap: bool | None = None):
        """read_states=False: no eval callback at all (llama.cpp alone, for comparisons); taps then get nothing.
        max_outputs: positions one decode may ask outputs for (None: n_batch); llama.cpp sizes its compute buffer
        for that many logits (Gemma 3: 1 MB each). swa_full=False: the sliding-window layers' KV cache holds
        each sequence's window, not n_ctx cells (llama-server's default; --swa-full there): no caller reads a
        position again once it has left the window. overlap: whether callers run a step's head work beside the
        decode (`beside`; None: where llama.cpp leaves a core free)."""
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
        libs = os.environ.get("LLAMA_CPP_LIB_PATH") or Path(lib.__file__).parent / "lib"  # the ggml llama.cpp loaded
        cpu = sorted(Path(libs).glob("libggml-cpu.*"))  # AMX weight buffers crash
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
        cparams.swa_full = swa_full  # Gemma 3 270M at n_ctx 18432, 24 sequences: 187.5 MB, full-size 270 MB
        if max_outputs is not None:
            cparams.n_outputs_max = max_outputs
        cparams.no_perf = True
        cparams.n_threads = cparams.n_threads_batch = threads or default_threads()  # as llama-server's
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
        self.threads = int(lib.llama_n_threads(self.ctx))
        self.openmp = b"OPENMP = 1" in lib.llama_print_system_info()  # its threads an OpenMP team (kernel_threads)
        self.cores = usable_cpus()
        log.info("llama.cpp: %d thread(s), %d usable core(s)%s", self.threads, self.cores, "" if threads else
                 " (OMP_NUM_THREADS, else one per physical core, as llama-server; --threads N to set)")
        self.overlap = overlap
        self._side: ThreadPoolExecutor | None = None  # the thread decode's `during` runs on

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
               wanted: set[int] | None = None, outputs: str = "last", stop_after: int | None = None,
               read: bool = False, during: Callable[[Callable[[int], np.ndarray | None]], None] | None = None
               ) -> np.ndarray | None:
        """Run the rows as one llama_batch. Each wanted state goes to every tap as (total tokens, d), the rows'
        tokens one after another in order. -> the next-token logits at each row's last token (rows, vocab),
        or None when the pass stopped early. outputs="all" asks for every position's output (needed for the
        last states of all positions; costs the LM head on every token). read=True: the wanted states are read
        without taps, into `states()` (a pass of at most GATHER_TOKENS tokens). during(state), with read: run on
        another thread while llama.cpp decodes, state(i) giving state i's rows (tokens, d) as soon as they are
        copied (None: the decode ended without them); decode returns after `during` has, and raises its error."""
        lib = _lib()
        n = sum(len(r.tokens) for r in rows)
        if n == 0:
            raise DataError("nothing to decode")
        if n > self.n_batch:
            raise DataError(f"{n} tokens in one llama.cpp batch; at most {self.n_batch}")
        if any(r.seq >= self.n_seq for r in rows):
            raise DataError(f"a sequence id beyond the {self.n_seq} the llama.cpp context holds")
        if read and n > GATHER_TOKENS:
            raise DataError(f"{n} tokens: states are read without taps for at most {GATHER_TOKENS} tokens a pass")
        if (taps or read) and not self.read_states:
            raise ModelError("this llama.cpp context was made without its eval callback (read_states=False)")
        wanted = set(range(self.num_states)) if wanted is None else wanted

        def sink(i, z):
            for tap in taps:
                tap(i, z)

        with self._lock:  # one decode at a time: the batch, the reader and the context are shared
            self._kernel_threads(self.threads if self.openmp else 1)
            self._forget_returned()
            last = self._fill(rows, outputs)
            if self.reader is not None:
                self.reader.start(n, wanted if taps or read else set(), sink if taps else None, stop_after)
            side, ended = None, threading.Event()
            if during is not None:
                if not (read and self.reader.gathering):
                    raise DataError("decode's `during` needs a gathered read (read=True, some state wanted)")
                side = self.side_thread().submit(during, lambda i: self.reader.ready(i, ended))
            try:
                code = lib.llama_decode(self.ctx, self._batch)
            finally:
                ended.set()
                failed = side.exception() if side is not None else None  # waits for `during`
            if self.reader is not None:
                self.reader.finish()
            if code != 0:
                raise ModelError(f"llama_decode failed (code {code}): the KV cache may be full (n_ctx {self.n_ctx})")
            if failed is not None:
                raise failed
            if stop_after is not None:
                return None
            outs = np.empty((len(rows), self.n_vocab), np.float32)
            for j, pos in enumerate(last):
                ptr = lib.llama_get_logits_ith(self.ctx, pos)  # by the token's index in the batch
                outs[j] = np.ctypeslib.as_array(ptr, (self.n_vocab,))
            return outs

    def run(self, rows: list[Row], taps: Sequence[Callable[[int, np.ndarray], None]] = (),
            stop_after: int | None = None, wanted: set[int] | None = None,
            logits_of: Sequence[int] | None = None) -> np.ndarray | None:
        """The rows' tokens as one pass, every position's states to the taps, -> each row's next-token logits
        (rows, vocab), or None when stopped early. Every position's output is asked for while a tap reads the
        last state (llama.cpp computes the last layer only for output rows): the graph then ends after the final
        norm (the LM head over every token costs more than the rest of Gemma 3 270M's pass), and the last token of
        each row in logits_of (default all; the others' logits are 0, None if it is empty: a piece of a longer
        prompt needs none) runs once more, alone, for its logits (its KV entry removed first, as after one pass)."""
        last = self.num_states - 1
        reads_last = taps and (wanted is None or last in wanted) and (stop_after is None or stop_after >= last)
        if not reads_last or all(len(r.tokens) == 1 for r in rows):
            return self.decode(rows, taps, wanted, outputs="last", stop_after=stop_after)
        self.decode(rows, taps, wanted, outputs="all", stop_after=last)
        want = list(range(len(rows))) if logits_of is None else sorted(set(logits_of))
        if stop_after is not None or not want:
            return None
        tail = [Row([rows[j].tokens[-1]], rows[j].seq, rows[j].start + len(rows[j].tokens) - 1) for j in want]
        self.truncate({r.seq: r.start for r in tail})
        logits = np.zeros((len(rows), self.n_vocab), np.float32)
        logits[want] = self.decode(tail, [], outputs="last")
        return logits

    def final_states(self, rows: list[Row]) -> np.ndarray:
        """Every position's final-norm output (tokens, d), the rows' tokens in order, read as llama.cpp's own
        embeddings (llama_set_embeddings for this decode, no pooling): what a context without the eval callback
        gives of the states (llama-server's /v1/embeddings reads the same output)."""
        lib = _lib()
        n = sum(len(r.tokens) for r in rows)
        if n > self.n_batch:
            raise DataError(f"{n} tokens in one llama.cpp batch; at most {self.n_batch}")
        with self._lock:
            self._forget_returned()
            self._fill(rows, "all")
            lib.llama_set_embeddings(self.ctx, True)
            try:
                code = lib.llama_decode(self.ctx, self._batch)
            finally:
                lib.llama_set_embeddings(self.ctx, False)
            if code != 0:
                raise ModelError(f"llama_decode failed (code {code}): the KV cache may be full (n_ctx {self.n_ctx})")
            return np.ctypeslib.as_array(lib.llama_get_embeddings(self.ctx), (n, self.d)).copy()

    def states(self) -> dict[int, np.ndarray]:
        """The states the last small pass read ({state: (tokens, d)}, views valid until the next decode)."""
        return self.reader.gathered if self.reader is not None else {}

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

    def beside(self) -> bool:
        """Whether a decode (a step or a pass, of any number of rows) runs its heads' work beside the decode
        (`during`): as set (overlap), else where llama.cpp leaves a core free (more usable cores than its
        threads). Beside threads that use every core the work stalls them: gemma3-270m on 2 threads of 2 cores,
        four served heads (a guard read each step), a one-row generation 1.16-1.17x the time without heads beside
        against 1.11-1.13x after the decode; at 8 rows 1.12 against 1.09 a step (benchmarks/heads_overlap.py,
        docs/llm.md)."""
        return self.read_states and (self.overlap if self.overlap is not None else self.cores > self.threads)

    def side_thread(self) -> ThreadPoolExecutor:
        """The one thread that work beside this context's decodes runs on (decode's `during`, the taps of
        gguf_steps.decode_rows), in the order it is given."""
        if self._side is None:
            self._side = ThreadPoolExecutor(1, thread_name_prefix="llamacpp-beside", initializer=self._kernel_threads,
                                            initargs=(1,))
        return self._side

    def _kernel_threads(self, n: int) -> None:
        """The heads' compiled kernels that the calling thread runs next use n threads (kernel_threads.use): after a
        decode llama.cpp's own, idle then (where they are an OpenMP team: else one, rather than a second pool
        competing with its own); beside a decode (the side thread) one. Only where states are read."""
        if self.read_states:
            from adalayers.infer import kernel_threads
            kernel_threads.use(n)

    def close(self) -> None:
        lib = _lib()
        if getattr(self, "_side", None) is not None:
            self._side.shutdown()
            self._side = None
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


class Sequences:
    """A batch's llama.cpp sequences (adalayers.infer.runtime.Cache): positions are per sequence, so padding
    and trimming columns change nothing; a row that leaves gives its sequence back, and the rest are given
    back when this object is dropped."""

    def __init__(self, engine: LlamaCpp, n: int):
        self.engine, self.ids = engine, engine.acquire(n)
        weakref.finalize(self, engine.release, self.ids)  # the list as it is then: the rows still held

    def select(self, idx: list[int]) -> "Sequences":
        keep = [self.ids[i] for i in idx]
        self.engine.release([s for s in self.ids if s not in keep])
        self.ids[:] = keep
        return self

    def merged(self, other: "Sequences", width: int) -> "Sequences":
        self.ids += other.ids
        other.ids.clear()  # now held (and given back) by this one
        return self

    def trimmed(self, width: int) -> "Sequences":
        return self


def context_size(ctx_size: int | None, parallel: int | None) -> dict:
    """llama.cpp's {n_ctx, n_seq} for generations of `ctx_size` KV tokens and `parallel` sequences in all (the
    meaning of llama-server's --ctx-size and --parallel): the context is split in two equal shares, one for
    /predict's passes and one for generations (LlamaCppBackbone.generation_room), so it holds twice as much.
    None: 2048 tokens, 16 sequences (LlamaCppBackbone.load's own default context)."""
    return {"n_ctx": 2 * (ctx_size or 2048), "n_seq": 2 * (parallel or 16)}


def gguf_path(name: str) -> Path:
    """An alias of a GGUF base (gemma3-270m, qwen2.5-0.5b) or a .gguf path -> the GGUF file itself."""
    from adalayers.model import model_packages

    if name in model_packages.SPLIT_GGUF:
        return model_packages.joined_gguf(name)
    path = Path(name).expanduser()
    if path.suffix.lower() != ".gguf":
        raise ModelError(f"the llama.cpp runtime runs GGUF bases (an alias: {', '.join(model_packages.SPLIT_GGUF)}, "
                         f"or a .gguf file), not {name!r}")
    return path


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
