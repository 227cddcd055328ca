"""The torch-free serving path of GGUF bases: llama.cpp runs the base, the heads are numpy, the tokenizer is
llama.cpp's own. Neither torch nor transformers is imported.

    side = GgufPredictor.load("gemma3-270m", ["runs/cola_gemma"])      # the same run folders as on torch
    side.predict(["The book was written by John."])                   # PredictorBase's rows and answers
    side.generate(["Write one sentence about cats."], max_new_tokens=32)  # infer/generate's one loop

What each part is:
    base       GgufRuntime: one LlamaCpp context (adalayers.infer.llamacpp) shared by /predict's passes and the
               generations (ContextShare: the same two shares as the torch llama.cpp runtime), its vocabulary as
               the tokenizer (GgufTokenizer, with the GGUF's chat template)
    heads      each run folder read by adalayers.infer.numpy_runs (safetensors' numpy reader, the same checks as
               the torch loader: config digest, checksums, the base's fingerprint); the mixer of every head in
               one LayerMix per set of heads asked together
    passes     a pass feeds every asked head from llama.cpp's eval callback; generation's passes are
               adalayers.infer.gguf_steps (each row one llama.cpp sequence, per-step reads incremental)

The base's fingerprint is the torch runtime's (so a head trained on either runtime loads here): read from where
the torch runtime keeps it beside the GGUF's conversion; when it was never computed, a separate Python process
computes it once (that process imports torch; this one never does). A base served without heads needs none.
"""
from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import numpy as np

from adalayers.data.windows import consecutive
from adalayers.errors import ModelError
from adalayers.infer.heads import Head, load_heads, used_layers
from adalayers.infer.llamacpp import LlamaCpp, Row, gguf_path
from adalayers.infer.llamacpp_share import ContextShare
from adalayers.infer.gguf_steps import OUTPUTS_AT_ONCE, decode_rows, read_rows
from adalayers.infer.llamacpp_tokenizer import GgufTokenizer
from adalayers.infer.layer_mix import LayerMix
from adalayers.infer.numpy_incremental import IncrementalReads
from adalayers.infer.numpy_runs import load_task
from adalayers.infer.predictor_base import PredictorBase
from adalayers.store.head_spec import parse_heads
from adalayers.store.trust import trusting

log = logging.getLogger(__name__)
# tokens of one llama_decode at most (n_batch = n_ubatch: the eval callback needs a batch in one graph); llama.cpp
# sizes its compute buffers for it, and passes and prefills are cut into decodes of at most this many
N_BATCH = 512


class GgufRuntime(ContextShare):
    """A GGUF base on llama.cpp as the doors read a base and a runtime: name, tokenizer, sizes, fingerprint(),
    rows_per_pass / generation_room / prefill_tokens / usage (ContextShare), own_output, eos_ids."""

    is_causal, has_own_output, runtime_name, device = True, True, "llama.cpp", "cpu"
    PASS_SEQS, PASS_TOKENS = 8, 2048  # the passes' share of the context (ContextShare), beside the generations'

    def __init__(self, engine: LlamaCpp, tokenizer: GgufTokenizer, name: str, path: Path, fingerprint: str):
        self.engine, self.tokenizer, self.name, self.path = engine, tokenizer, name, path
        self.num_layers, self.hidden_size = engine.num_states, engine.d
        self._fingerprint = fingerprint

    @classmethod
    def sizes(cls, ctx_size: int | None, parallel: int | None) -> dict:
        """The context for generations of `ctx_size` KV tokens and `parallel` sequences (llama-server's --ctx-size
        and --parallel; None: 2048 and 16), plus the passes' share."""
        return {"n_ctx": (ctx_size or 2048) + cls.PASS_TOKENS, "n_seq": (parallel or 16) + cls.PASS_SEQS}

    @classmethod
    def load(cls, name: str, n_ctx: int = 4096, n_seq: int = 24, threads: int | None = None,
             heads: bool = True) -> "GgufRuntime":
        """`heads`: heads will be read (their base's fingerprint is needed, and llama.cpp's states)."""
        from adalayers.model import model_packages
        from adalayers.model.chat_templates import gguf_chat_template

        path = gguf_path(name)
        engine = LlamaCpp(path, n_ctx=n_ctx, n_seq=n_seq, n_batch=min(n_ctx, N_BATCH), threads=threads,
                          read_states=heads,  # no heads: no eval callback at all (nor numba's compiler)
                          max_outputs=max(OUTPUTS_AT_ONCE, n_seq))  # a step's rows, or a pass's cut (gguf_steps)
        tokenizer = GgufTokenizer(engine)
        tokenizer.chat_template = gguf_chat_template(str(path))
        known = model_packages.SPLIT_GGUF.get(name)
        return cls(engine, tokenizer, name, path, base_fingerprint(path, known.sha256 if known else None, heads))

    @property
    def base(self) -> "GgufRuntime":
        return self

    def pass_share(self) -> tuple[int, int]:
        return self.PASS_SEQS, self.PASS_TOKENS

    def pass_tokens(self) -> int:
        """A pass is cut into llama_decodes as it needs (gguf_steps.decode_rows): its share of the context."""
        return self.PASS_TOKENS

    def prefill_tokens(self) -> int:
        """Prefills are cut into llama_decodes too: a request's prompts are bounded by the context alone."""
        return self.engine.n_ctx

    def fingerprint(self) -> str:
        return self._fingerprint

    def own_output(self) -> tuple[str, None]:
        return "next_token", None

    def decoder(self) -> "GgufRuntime":
        """What a generation request is checked against (infer/request.check_request): eos_ids (ContextShare)."""
        return self



def base_fingerprint(path: Path, sha256: str | None, needed: bool) -> str:
    """The torch runtime's fingerprint of the GGUF (model.backbone.gguf_fingerprint), read where it is kept beside
    the file's conversion, or computed once by a separate Python process; not needed (no heads to check): the
    kept one, else an id of the file's bytes (what /predict and system_fingerprint show)."""
    from adalayers.files import sha256 as file_sha256
    from adalayers.model import gguf_models

    digest = sha256 or file_sha256(path)
    kept = gguf_models.kept_fingerprint(path, digest)  # never converts here: that would import torch
    if kept is not None:
        return kept
    if not needed:
        return "gguf-" + digest[:16]
    log.info("%s: computing its base fingerprint once, in a separate process (torch reads its conversion)", path)
    code = "import sys; from adalayers.model.backbone import gguf_fingerprint; print(gguf_fingerprint(sys.argv[1]))"
    done = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise ModelError(f"{path}: the heads are checked against the base's fingerprint, computed once by the torch "
                         f"runtime (pip install torch transformers), and that failed: {last}")
    return done.stdout.strip().splitlines()[-1]


def numpy_task(path: Path, base: GgufRuntime):
    """A run folder as a numpy task on `base` (infer/heads.load_heads' reader on the torch-free path)."""
    task, cfg, _ = load_task(path, base)
    return task, cfg


def warm_up(tasks: list, d: int) -> None:
    """The compiled kernels of the heads' work (a prefill's GELU, the step's mix, the incremental reads: numba)
    loaded from numba's cache, or compiled, now rather than in the first request: one zero row of a state mixed
    as a prefill does (LayerMix.add: gelu_kernel) and of every state as a step does (add_layers: mix_rows, its
    GELU its own), then read as a prompt of two rows and a step of one."""
    if not tasks:
        return
    mix = LayerMix(tasks)
    mix.begin(1)
    mix.add(mix.layers[0], np.zeros((1, d), np.float32))
    mix.take()
    mix.begin(1)
    mix.add_layers(mix.layers, np.zeros((len(mix.layers), 1, d), np.float32))
    accs = mix.take()
    seq = [j for j, t in enumerate(tasks) if IncrementalReads.applies(t)]
    if seq:
        reads = IncrementalReads([tasks[j] for j in seq])
        for n in (2, 1):
            reads.step(["warm-up"], [np.repeat(accs[j], n, 0) for j in seq], [n])


class GgufPredictor(PredictorBase):
    """PredictorBase (rows, answers) over llama.cpp with numpy heads: what `adalayers serve --runtime llama.cpp`
    serves (see the module doc)."""

    @classmethod
    def load(cls, base: str, heads: list, primary: bool = True, threads: int | None = None,
             ctx_size: int | None = None, parallel: int | None = None, trust_unverified: bool = False,
             **kw) -> "GgufPredictor":
        """As SideTasks.load(base, heads, runtime="llama.cpp", ...): `ctx_size` KV tokens and `parallel`
        sequences for generations, and the passes' share beside them (GgufRuntime.sizes)."""
        from threadpoolctl import threadpool_limits

        threadpool_limits(1, "blas")  # the heads' small products on one thread: OpenBLAS' spinning threads
        specs = list(parse_heads(heads))  # would compete with llama.cpp's own
        with trusting(trust_unverified):
            runtime = GgufRuntime.load(base, threads=threads, heads=bool(specs),
                                       **GgufRuntime.sizes(ctx_size, parallel))
            if specs:
                e = runtime.engine
                log.info("heads' decode-step work: %s", "beside llama.cpp's decode" if e.beside() else
                         "after each decode step")
            loaded = load_heads(runtime, specs, numpy_task)
            warm_up([h.task for h in loaded], runtime.hidden_size)
            return cls(runtime, loaded, primary, **kw)

    def __init__(self, runtime: GgufRuntime, heads: list[Head], primary: bool = True, **kw):
        super().__init__(runtime, heads, primary, **kw)
        self._mixes: dict[tuple[str, ...], LayerMix] = {}

    def generation_passes(self, heads: list[Head]):
        from adalayers.infer.gguf_steps import SequencePasses

        return SequencePasses(self, heads)

    def generate(self, prompts: list[str], max_new_tokens: int = 32, tasks: list[str] | None = None,
                 **kw) -> list[dict]:
        from adalayers.infer.generate import generate
        return generate(self, prompts, max_new_tokens, tasks, **kw)

    def _run(self, rows: list[dict], heads: list[Head], abandoned=None) -> dict:
        """Per micro-batch (_plan), llama.cpp passes of the rows (as many as one llama_decode takes), every asked
        head fed by them; -> per row the next-token logits (primary) and each head's values."""
        engine = self.runtime.engine
        names = tuple(h.name for h in heads)
        mix = self._mixes.setdefault(names, LayerMix([h.task for h in heads])) if heads else None
        layers = used_layers(heads)
        stop = None if self.primary or not heads else max(layers)
        base_rows, head_rows = [None] * len(rows), {n: [None] * len(rows) for n in names}
        for idx in self._plan(rows, abandoned):
            self.rows_run += len(idx)
            lengths = [len(rows[i]["input_ids"]) for i in idx]
            seqs = engine.acquire(len(idx))
            try:
                logits, accs = decode_rows(engine, [Row(rows[i]["input_ids"], s) for i, s in zip(idx, seqs)], mix,
                                           layers, stop)
            finally:
                engine.release(seqs)
            self._read(heads, idx, lengths, accs, head_rows)
            for j, i in enumerate(idx):
                if logits is not None and not rows[i]["window"]:
                    base_rows[i] = logits[j:j + 1]
        return {"base": base_rows, "heads": head_rows}

    def _read(self, heads: list[Head], part: list[int], lengths: list[int], accs: list[np.ndarray],
              head_rows: dict) -> None:
        """Every head on the rows of one pass (gguf_steps.read_rows over each row's F)."""
        if not heads:
            return
        at = np.concatenate([[0], np.cumsum(lengths)]).astype(int)
        F = [[acc[at[j]:at[j + 1]] for j in range(len(part))] for acc in accs]
        for h, values in zip(heads, read_rows([h.name for h in heads], [h.task for h in heads], F, [0] * len(part))):
            for j, i in enumerate(part):
                head_rows[h.name][i] = values[j]

    def embed(self, texts: list[str], pooling: str = "mean") -> list[list[float]]:
        """As SideTasks.embed: the final norm's output over each text's tokens, pooled, L2-normalized."""
        ids = self._embedding_ids(texts, pooling)
        engine, last, out = self.runtime.engine, self.runtime.num_layers - 1, []
        for a, b in consecutive([len(i) for i in ids], self.runtime.pass_tokens(), self.batch_size):
            seqs = engine.acquire(b - a)
            try:
                rows = [Row(ids[i], s) for i, s in zip(range(a, b), seqs)]
                if engine.read_states:
                    _, (z,) = decode_rows(engine, rows, LastState(last), [last], last)
                else:  # no eval callback (a base without heads): llama.cpp's own embeddings, row by row, cut
                    z = np.concatenate([engine.final_states([Row(r.tokens[c:c + OUTPUTS_AT_ONCE], r.seq, c)])
                                        for r in rows for c in range(0, len(r.tokens), OUTPUTS_AT_ONCE)])
            finally:
                engine.release(seqs)
            at = np.concatenate([[0], np.cumsum([len(ids[i]) for i in range(a, b)])]).astype(int)
            for j in range(b - a):
                v = z[at[j]:at[j + 1]].astype(np.float64)
                v = v.mean(0) if pooling == "mean" else v[-1]
                out.append((v / max(np.linalg.norm(v), 1e-12)).tolist())
            self.rows_run += b - a
        return out


class LastState:
    """What decode_rows feeds (as it feeds a LayerMix): here the final state itself, every position's."""

    def __init__(self, last: int):
        self.last, self.tasks, self.z = last, [None], None

    def begin(self, n: int) -> None:
        self.z = None

    def add(self, i: int, z: np.ndarray) -> None:
        if i == self.last:
            self.z = np.array(z, np.float32)

    def take(self) -> list[np.ndarray]:
        return [self.z]
