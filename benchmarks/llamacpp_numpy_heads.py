"""Heads on llama.cpp without torch: the numpy heads (adalayers.infer.numpy_heads) fed by the compiled gather
(adalayers.infer.llamacpp_filter), against llama.cpp alone, on one GGUF base.

    steps    paired decode steps: the same prompts in two sets of sequences of one context, advanced in turn,
             one set with no heads (no state read), the other with four heads (two sequence heads read every
             step, a sequence head as a per-step guard, a token head read at the end, its steps' states kept and
             mixed 64 rows at a time as the server does, gguf_steps.LATER_ROWS; the per-step reads
             incremental, adalayers.infer.numpy_incremental, or with --full-reads the full read over the whole
             text each step, as before it): each step's time with
             heads over its partner's; median, and the sum over the 128 steps (whole generation, interleaved);
             and the median of each part of a step with heads: part_ms_decode (llama_decode with the gather),
             _states (the gathered states stacked), _mix (LayerMix.add_layers), _reads (the per-step reads and
             the guard's check), and part_ms_decode_alone (its partner's llama_decode); where the heads' work runs
             beside the decode (row "beside": LlamaCpp.beside, --overlap), part_ms_decode is the decode with
             it and part_ms_after what is left after the decode returns
    whole    whole generations (prefill + --new tokens + the heads' final reads), the two configurations in
             rotating order, medians over --repeats; time with heads / alone
    memory   peak RSS (ru_maxrss) of a process that loads the base and generates --new tokens at batch 1:
             llama.cpp alone (no callback); the torch-free path (4 numpy heads, llama.cpp's tokenizer, torch and
             transformers made unimportable); the torch path (LlamaCppBackbone: transformers' tokenizer, 4 torch
             heads through SideTasks.generate). Each at --n-batch (n_ubatch = n_batch).

Heads: configs/cola.yaml's sequence head (k 64) x 3 and configs/conll.yaml's token head (k 128), random weights,
uniform layer weights (every state projected: the most work a head adds).

    nice python benchmarks/llamacpp_numpy_heads.py --base gemma3-270m --threads 1,2 --batch 1,8 --new 128
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")  # before numpy: the heads' small products on one thread, beside
import numpy as np  # noqa: E402  (llama.cpp's own threads; OpenBLAS' spinning threads would compete with them)

ROOT = Path(__file__).resolve().parents[1]
if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(ROOT / "src"))

PROMPTS = ["The history of the city begins in", "Write a short note to a friend about the weather:",
           "Three facts about the moon:", "The recipe needs flour, eggs and", "Once upon a time, a small robot",
           "The meeting is moved to Thursday because", "In this paper we show that", "Dear customer, your order"]


def random_task(config: str, kind: str, labels: list[str], L: int, d: int, seed: int, bos: bool):
    """A numpy Task of a config's shapes with random weights and uniform layer weights."""
    from adalayers import config as config_mod
    from adalayers.infer.numpy_runs import task_from_state

    cfg = config_mod.load(ROOT / "configs" / config)
    cfg.head.kind = kind
    k, h, c = cfg.mixer.k, cfg.head, len(labels)
    rng = np.random.default_rng(seed)

    def r(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    state = {"mixer.p": np.ones(L, np.float32), **{f"mixer.proj.{i}.weight": r(k, d) for i in range(L)},
             "head.out.weight": r(c, k), "head.out.bias": r(c)}
    if kind == "token":
        for j in range(h.encoder_layers):
            p = f"head.encoder.layers.{j}."
            state.update({p + "norm1.weight": np.ones(k, np.float32), p + "norm1.bias": r(k),
                          p + "norm2.weight": np.ones(k, np.float32), p + "norm2.bias": r(k),
                          p + "self_attn.in_proj_weight": r(3 * k, k), p + "self_attn.in_proj_bias": r(3 * k),
                          p + "self_attn.out_proj.weight": r(k, k), p + "self_attn.out_proj.bias": r(k),
                          p + "linear1.weight": r(h.dim_feedforward, k), p + "linear1.bias": r(h.dim_feedforward),
                          p + "linear2.weight": r(k, h.dim_feedforward), p + "linear2.bias": r(k)})
    else:
        state.update({"head.attn.in_proj_weight": r(3 * k, k), "head.attn.in_proj_bias": r(3 * k),
                      "head.attn.out_proj.weight": r(k, k), "head.attn.out_proj.bias": r(k)})
    return task_from_state(cfg, labels, state, bos, L, d)


def four_heads(engine, bos: bool) -> list:
    L, d = engine.num_states, engine.d
    seq = [random_task("cola.yaml", "sequence", ["unacceptable", "acceptable"], L, d, s, bos) for s in range(3)]
    return seq + [random_task("conll.yaml", "token", [f"t{j}" for j in range(9)], L, d, 9, bos)]


class Gen:
    """One set of sequences generating greedily, with or without the heads (numpy, read per step)."""

    def __init__(self, engine, tok, prompts: list[str], seqs: list[int], heads: list | None, new: int,
                 full_reads: bool = False):
        from adalayers.infer import numpy_heads as nh
        from adalayers.infer.layer_mix import LayerMix
        from adalayers.infer.numpy_incremental import IncrementalReads

        self.engine, self.heads, self.nh = engine, heads, nh
        self.ids = [tok.encode(p) for p in prompts]
        self.seqs, self.new = seqs, new
        width = max(len(i) for i in self.ids) + new + 1
        self.mask = np.zeros((len(prompts), width), bool)
        self.pos = [len(i) for i in self.ids]
        self.layers = sorted({i for t in heads for i in t.used_layers()}) if heads else []
        self.mix = LayerMix(heads) if heads else None  # the prefill's
        # a step's: the sequence heads mixed at once, the token head's states kept and mixed LATER_ROWS rows at a
        # time (or at the final read), as gguf_steps.SequencePasses does
        self.now = [j for j, t in enumerate(heads or []) if t.kind != "token"]
        self.later = [j for j, t in enumerate(heads or []) if t.kind == "token"]
        self.now_mix, self.later_mix = (LayerMix([heads[j] for j in js]) if heads else None
                                        for js in (self.now, self.later))
        self.now_layers, self.later_layers = (sorted({i for j in js for i in heads[j].used_layers()}) if heads
                                              else [] for js in (self.now, self.later))
        self.kept: list[tuple[int, np.ndarray]] = []  # (the step's column, the token head's states)
        self.accs = [np.zeros((len(prompts), width, t.k), np.float32) for t in heads or []]
        self.col = width - new - 1  # prompts right-aligned at column col - 1
        self.guard = []
        self.seq_idx = [j for j, t in enumerate(heads or []) if t.kind != "token"]
        self.reads = None if full_reads or not heads else IncrementalReads([heads[j] for j in self.seq_idx])
        self.parts: dict[str, list[float]] = {}  # per step: seconds of each part (step)

    def prefill(self):
        from adalayers.infer.llamacpp import Row

        eng = self.engine
        rows = [Row(ids, s) for ids, s in zip(self.ids, self.seqs)]
        n = sum(len(i) for i in self.ids)
        if self.heads:
            self.mix.begin(n)
            # every token's final norm, the LM head skipped; then each row's last token once more for its logits
            # (its KV entry removed first), as LlamaCppBackbone.run
            eng.decode(rows, [self.mix.add], wanted=set(self.layers), outputs="all", stop_after=max(self.layers))
            accs = self.mix.take()
            self._place(accs, [len(i) for i in self.ids], prefill=True)
            if self.reads:  # the caches made at the prefill
                self.reads.step(self.seqs, [accs[j] for j in self.seq_idx], [len(i) for i in self.ids])
            eng.truncate({s: len(ids) - 1 for ids, s in zip(self.ids, self.seqs)})
            logits = eng.decode([Row([ids[-1]], s, len(ids) - 1) for ids, s in zip(self.ids, self.seqs)])
        else:
            logits = eng.decode(rows, outputs="last")
        self.next = logits.argmax(-1)

    def _place(self, accs, lengths, prefill=False):
        start = 0
        for b, n in enumerate(lengths):
            cols = slice(self.col - n, self.col) if prefill else slice(self.col, self.col + 1)
            self.mask[b, cols] = True
            for a, acc in zip(self.accs, accs):
                a[b, cols] = acc[start:start + n]
            start += n
        if not prefill:
            self.col += 1

    def step(self):
        from adalayers.infer.llamacpp import Row

        eng = self.engine
        rows = [Row([int(t)], s, p) for t, s, p in zip(self.next, self.seqs, self.pos)]
        self.pos = [p + 1 for p in self.pos]
        if not self.heads:
            t0 = time.perf_counter()
            self.next = eng.decode(rows, outputs="last").argmax(-1)
            self.parts.setdefault("decode", []).append(time.perf_counter() - t0)
            return
        if eng.beside():  # the heads' work beside the decode, as SequencePasses does
            return self._step_beside(rows)
        t0 = time.perf_counter()
        logits = eng.decode(rows, wanted=set(self.layers), outputs="last", read=True)
        t1 = time.perf_counter()
        states = eng.states()
        z = np.stack([states[i] for i in self.now_layers])
        t2 = time.perf_counter()
        accs = self._step_mix(z, states.__getitem__)
        t3 = time.perf_counter()
        self._after_mix(accs, len(rows))
        self.next = logits.argmax(-1)
        t4 = time.perf_counter()
        for part, took in (("decode", t1 - t0), ("states", t2 - t1), ("mix", t3 - t2), ("reads", t4 - t3)):
            self.parts.setdefault(part, []).append(took)

    def _step_mix(self, z, state) -> list:
        """The sequence heads' F of a step (z: their states); the token head's states kept, mixed once LATER_ROWS
        rows wait."""
        from adalayers.infer.gguf_steps import LATER_ROWS

        self.now_mix.begin(z.shape[1])
        self.now_mix.add_layers(self.now_layers, z)
        accs = self.now_mix.take()
        if self.later:
            self.kept.append((self.col, np.stack([state(i) for i in self.later_layers])))
            if len(self.kept) * z.shape[1] >= LATER_ROWS:
                self._mix_later()
        return accs

    def _mix_later(self) -> None:
        if not self.kept:
            return
        z = np.concatenate([k for _, k in self.kept], 1)
        self.later_mix.begin(z.shape[1])
        self.later_mix.add_layers(self.later_layers, z)
        for j, acc in zip(self.later, self.later_mix.take()):
            b = len(self.seqs)
            for s, (col, _) in enumerate(self.kept):
                self.accs[j][:, col] = acc[s * b:(s + 1) * b]
        self.kept = []

    def _after_mix(self, accs, n: int) -> None:
        """The step's F placed (the sequence heads'), the per-step reads of the sequence heads and the guard's
        check."""
        for j, acc in zip(self.now, accs):
            self.accs[j][:, self.col] = acc
        self.mask[:, self.col] = True
        self.col += 1
        seq = [self.heads[j] for j in self.seq_idx]  # self.now: the step's accs are theirs
        if self.reads:
            outs = self.reads.step(self.seqs, accs, [1] * n)
        else:
            outs = self.nh.read_all(seq, [self.accs[j][:, :self.col] for j in self.seq_idx], self.mask[:, :self.col])
        self.guard.append(self.nh.probabilities(seq[-1], outs[-1])[:, 1] >= 0.99)  # the guard's check

    def _step_beside(self, rows) -> None:
        """The mix and the reads on the decode's `during` thread once the deepest state is copied; part_ms_decode is
        the whole decode with them, part_ms_after what is left once it returns."""
        def during(state):  # once the deepest state is copied (SequencePasses._step_beside)
            if state(self.layers[-1]) is None:
                return
            self._after_mix(self._step_mix(np.stack([state(i) for i in self.now_layers]), state), len(rows))

        t0 = time.perf_counter()
        logits = self.engine.decode(rows, wanted=set(self.layers), outputs="last", read=True, during=during)
        t1 = time.perf_counter()
        self.next = logits.argmax(-1)
        t2 = time.perf_counter()
        for part, took in (("decode", t1 - t0), ("after", t2 - t1)):
            self.parts.setdefault(part, []).append(took)

    def finish(self):
        if self.heads:
            self._mix_later()
            return self.nh.read_all(self.heads, [a[:, :self.col] for a in self.accs], self.mask[:, :self.col])


def paired(engine, tok, heads, batch: int, new: int, full_reads: bool) -> dict:
    """Both sets advanced in turn (the order alternating per step): per-step ratios and the summed times."""
    engine_free(engine)
    prompts = (PROMPTS * 2)[:batch]
    plain, mine = Gen(engine, tok, prompts, list(range(batch)), None, new), \
        Gen(engine, tok, prompts, list(range(batch, 2 * batch)), heads, new, full_reads)
    plain.prefill()
    mine.prefill()
    ta, tb, ca, cb = [], [], [], []
    for s in range(new):
        for g, out, cpu in ((plain, ta, ca), (mine, tb, cb)) if s % 2 == 0 else ((mine, tb, cb), (plain, ta, ca)):
            t0, c0 = time.perf_counter(), time.process_time()
            g.step()
            out.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    mine.finish()

    def med(x):
        return round(statistics.median(x) * 1e3, 2)
    parts = {f"part_ms_{p}": med(x) for p, x in mine.parts.items()}
    parts["part_ms_decode_alone"] = med(plain.parts["decode"])
    return {**parts, "step_ms_alone": med(ta), "step_ms_heads": med(tb),
            "step_ratio_median": round(statistics.median([b / a for a, b in zip(ta, tb)]), 4),
            "sum_ratio": round(sum(tb) / sum(ta), 4), "step_cpu_ms_alone": med(ca), "step_cpu_ms_heads": med(cb),
            "step_cpu_ratio_median": round(statistics.median([b / a for a, b in zip(ca, cb)]), 4),
            "cpu_sum_ratio": round(sum(cb) / sum(ca), 4)}


def whole(engine, tok, heads, batch: int, new: int, repeats: int, full_reads: bool) -> dict:
    prompts = (PROMPTS * 2)[:batch]
    times, cpus = {"alone": [], "heads": []}, {"alone": [], "heads": []}
    order = ["alone", "heads"]
    for rep in range(repeats):
        for c in order if rep % 2 == 0 else order[::-1]:
            engine_free(engine)
            g = Gen(engine, tok, prompts, list(range(batch)), heads if c == "heads" else None, new, full_reads)
            t0, c0 = time.perf_counter(), time.process_time()
            g.prefill()
            for _ in range(new):
                g.step()
            g.finish()
            times[c].append(time.perf_counter() - t0)
            cpus[c].append(time.process_time() - c0)
    return {"whole_s_alone": round(statistics.median(times["alone"]), 3),
            "whole_s_heads": round(statistics.median(times["heads"]), 3),
            "whole_ratio_median": round(statistics.median([b / a for a, b in zip(times["alone"], times["heads"])]), 4),
            "whole_cpu_ratio_median": round(statistics.median([b / a for a, b in zip(cpus["alone"], cpus["heads"])]), 4)}


def warm_up(engine, tok, heads, full_reads: bool) -> None:
    """A short generation with the heads before anything is timed: numba's kernels loaded from its cache (or
    compiled) and their threads started, as the server does at load (gguf_serving.warm_up)."""
    engine_free(engine)
    g = Gen(engine, tok, PROMPTS[:2], [0, 1], heads, 4, full_reads)
    g.prefill()
    for _ in range(4):
        g.step()
    g.finish()


def engine_free(engine) -> None:
    """Every sequence's KV cache dropped (the next run starts at position 0)."""
    engine.release(engine.acquire(engine.free_sequences))
    engine.acquire(0)


def memory_child(kind: str, base: str, new: int, n_batch: int, threads: int) -> None:
    """One configuration in this process (run by --memory-child); prints its peak RSS in MB as JSON."""
    if kind == "torch-free":
        sys.modules["torch"] = None
        sys.modules["transformers"] = None
    if kind == "torch":
        from adalayers.infer.llamacpp_backbone import LlamaCppBackbone
        from adalayers.infer.sidetasks import SideTasks
        from adalayers.infer.heads import Head
        from adalayers.model.sidetask import SideTask
        from adalayers import config as config_mod

        backbone = LlamaCppBackbone.load(base, n_ctx=n_batch, n_seq=8, threads=threads)
        heads = []
        for j, (c, kind_, labels) in enumerate([("cola.yaml", "sequence", ["a", "b"])] * 3
                                               + [("conll.yaml", "token", [f"t{i}" for i in range(9)])]):
            cfg = config_mod.load(ROOT / "configs" / c)
            cfg.head.kind = kind_
            heads.append(Head(f"h{j}", SideTask(cfg, backbone.num_layers, backbone.hidden_size, labels,
                                                bos=backbone.adds_bos).eval(), Path("."), 64))
        SideTasks(backbone, heads, primary=False, max_length=64).generate(PROMPTS[:1], new, steps=True, ignore_eos=True)
    else:
        from adalayers.infer.llamacpp import LlamaCpp
        from adalayers.infer.llamacpp import gguf_path
        from adalayers.infer.llamacpp_tokenizer import GgufTokenizer

        engine = LlamaCpp(gguf_path(base), n_ctx=n_batch, n_seq=8, n_batch=n_batch, threads=threads,
                          read_states=kind == "torch-free")
        tok = GgufTokenizer(engine)
        g = Gen(engine, tok, PROMPTS[:1], [0], four_heads(engine, tok.adds_bos) if kind == "torch-free" else None, new)
        g.prefill()
        for _ in range(new):
            g.step()
        g.finish()
        assert "torch" not in sys.modules or sys.modules["torch"] is None or kind == "alone"
    print(json.dumps({"kind": kind, "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                      "torch_imported": sys.modules.get("torch") is not None}))


def memory(args) -> list[dict]:
    out = []
    for kind in ("alone", "torch-free", "torch"):
        for n_batch in [int(b) for b in args.n_batch.split(",")]:
            r = subprocess.run([sys.executable, __file__, "--memory-child", kind, "--base", args.base, "--new",
                                str(args.new), "--n-batch-child", str(n_batch), "--threads", args.threads.split(",")[0]],
                               capture_output=True, text=True, check=True)
            row = json.loads(r.stdout.strip().splitlines()[-1])
            row["n_batch"] = n_batch
            print(row, flush=True)
            out.append(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="gemma3-270m")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--n-batch", default="4096,512", help="memory part: the context's n_batch (= n_ubatch) values")
    ap.add_argument("--full-reads", action="store_true",
                    help="per-step sequence-head reads by the full read over the whole text each step (read_all), "
                         "not the incremental one (numpy_incremental): the cost before it")
    ap.add_argument("--overlap", default="auto", choices=["auto", "on", "off"],
                    help="the heads' step work beside llama.cpp's decode (LlamaCpp's overlap: auto = where it "
                         "leaves a core free, as the server does: LlamaCpp.beside)")
    ap.add_argument("--skip", default="", help="comma list of parts to skip: steps, whole, memory")
    ap.add_argument("--out", default="benchmarks/results/llamacpp_numpy_heads.json")
    ap.add_argument("--memory-child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--n-batch-child", type=int, default=512, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.memory_child:
        return memory_child(args.memory_child, args.base, args.new, args.n_batch_child, int(args.threads.split(",")[0]))
    from adalayers.infer.llamacpp import LlamaCpp
    from adalayers.infer.llamacpp import gguf_path
    from adalayers.infer.llamacpp_tokenizer import GgufTokenizer

    skip = set(args.skip.split(","))
    results = {"settings": {**vars(args), "machine": platform.processor() or platform.machine(),
                            "note": "shared 2-core machine (other jobs running): ratios within one run matter"},
               "runs": []}
    for threads in [int(t) for t in args.threads.split(",")]:
        engine = LlamaCpp(gguf_path(args.base), n_ctx=4096, n_seq=16, n_batch=512, threads=threads,
                          overlap={"auto": None, "on": True, "off": False}[args.overlap])
        tok = GgufTokenizer(engine)
        heads = four_heads(engine, tok.adds_bos)
        warm_up(engine, tok, heads, args.full_reads)
        results["settings"]["head_weight_bytes_a_step"] = sum(w.nbytes for t in heads for w in t.proj.values())
        results["settings"]["gguf_bytes"] = gguf_path(args.base).stat().st_size
        for batch in [int(b) for b in args.batch.split(",")]:
            row = {"threads": threads, "batch": batch, "new": args.new, "beside": engine.beside()}
            if "steps" not in skip:
                row.update(paired(engine, tok, heads, batch, args.new, args.full_reads))
            if "whole" not in skip:
                row.update(whole(engine, tok, heads, batch, args.new, args.repeats, args.full_reads))
            print(row, flush=True)
            results["runs"].append(row)
        engine.close()
    if "memory" not in skip:
        results["memory"] = memory(args)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
