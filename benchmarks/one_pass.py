"""What side tasks cost on top of the base's own pass, against the alternatives.

    (a)  the base alone
    (b)  the base + N side heads in one pass (one tap: GELU(Z_i) once and one GEMM per layer for all
         heads, adalayers.model.fused)
    (l)  as (b), the fused tap at every layer during the pass even when the pass is small (the runtime
         holds a pass of at most SMALL_PASS positions and runs all layers at once after it)
    (u)  as (b), but each head taps on its own (its own GELU, GEMM and LayerNorm per layer): the
         per-head path the fused one replaces, side by side with it
    (h)  the heads' own work without the base: the fused tap over the base's stored hidden states,
         then the heads' end() (the sequence heads' attention batched, sidetask.end_all; (p): each head's
         own end(), side by side) (t: the tap alone: GELU, the per-layer GEMM, LayerNorm, mixing); as
         a ratio to (a) it splits the one-pass overhead into projection and head, with the base's
         noise out of the measured interval
    (c)  N separately fine-tuned copies of the base (N full passes, each copy with its own classifier)
    (d)  output_hidden_states=True, then every head projects and stacks all layers (the original code's way)
    (e)  early exit: heads that use layers <= L only, the base stopped after layer L

Inputs are real IMDB reviews, packed so every row holds exactly T tokens (no padding). Timing runs
each configuration once per repeat in a rotating order (drift in a shared machine's load hits all
alike); a configuration's ratio is the median over repeats of its time / (a)'s time in the same
repeat. Heads are freshly initialised (weights do not change the work) with uniform layer weights:
every layer is projected, the most work a head can add.

Memory: peak bytes live in torch's CPU allocator during one pass, from torch.profiler's memory
events (profile_memory=True): every allocation and free, summed in time order, minus what was
live when the pass began. "extra" is a configuration's peak minus (a)'s.

    python benchmarks/one_pass.py --lengths 128 --repeats 5
    python benchmarks/one_pass.py --lengths 512 --repeats 3 --configs a,b1,b4,c1,d1,d4
    python benchmarks/one_pass.py --lengths 128 --precision bf16   # every configuration under bf16 autocast
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tarfile
import time
from contextlib import nullcontext
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from adalayers.model.backbone import Backbone, resolve  # noqa: E402
from adalayers.config import Config  # noqa: E402
from adalayers.model.precision import autocast_for  # noqa: E402
from adalayers.store.run import write_json, atomic_write  # noqa: E402
from adalayers.model.sidetask import SideTask, end_all, shared_tap  # noqa: E402
from adalayers.infer.heads import Head  # noqa: E402
from adalayers.infer.predictor import Predictor  # noqa: E402

ALL = "a,b1,b2,b4,b8,mixed4,l4,lmixed4,u4,umixed4,h4,p4,hmixed4,t4,tmixed4,c1,c2,d1,d4,e"


def imdb_rows(data: Path, tokenizer, batch: int, length: int) -> dict:
    """`batch` rows of exactly `length` tokens: consecutive IMDB train reviews joined until they fill a row."""
    path = data / "imdb" / "aclImdb_v1.tar.gz"
    if not path.is_file():
        sys.exit(f"IMDB not found at {path} (give --data)")
    texts, current, used = [], "", 0
    with tarfile.open(path, "r|gz") as tf:
        for m in tf:
            if not (m.isfile() and m.name.endswith(".txt") and "/train/" in m.name):
                continue
            review = tf.extractfile(m).read().decode("utf-8").replace("<br />", " ")
            current, used = f"{current} {review}", used + len(tokenizer(review, add_special_tokens=False)["input_ids"])
            if used >= length:
                texts.append(current)
                current, used = "", 0
            if len(texts) == batch:
                break
    enc = tokenizer(texts, truncation=True, max_length=length, return_tensors="pt")
    assert enc["input_ids"].shape == (batch, length), enc["input_ids"].shape
    return {k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc}


def make_head(backbone, kind: str, labels: list[str], seed: int, deepest: int | None = None) -> SideTask:
    """Shapes of configs/cola.yaml (sequence), imdb (sequence), conll (token), stsb (regression)."""
    cfg = Config()
    cfg.head.kind = kind
    torch.manual_seed(seed)
    task = SideTask(cfg, backbone.num_layers, backbone.hidden_size, labels).eval()
    if deepest is not None:  # layers above `deepest` get weight 0 (below the cutoff): early exit can stop there
        with torch.no_grad():
            task.mixer.p[deepest + 1:] = -1.0
    return task


def one_pass(backbone, heads, primary=True):
    """(b)/(e): the pass users run, as f(batch): Predictor.forward (adalayers.infer.predictor) on the TorchRuntime,
    every head tapping one shared tap; primary=False: the base stops after the deepest layer a head uses."""
    named = [Head(f"h{i}", t, Path("."), 512) for i, t in enumerate(heads)]
    predictor = Predictor(backbone, named, primary=primary)
    return lambda batch: predictor.forward(batch, named)[1]


def layer_by_layer(backbone, batch, heads):
    """(l): as (b), the fused tap run during the pass at every layer even for a small pass (the runtime holds a
    pass of at most SMALL_PASS positions and runs every layer at once after it), then end_all."""
    for t in heads:
        t.begin()
    backbone(batch, taps=[shared_tap(heads)])
    return end_all(heads, batch["attention_mask"])


def per_head(backbone, batch, heads):
    """(u): one pass, every head its own tap (SideTask.tap: its own GELU, GEMM and LayerNorm)."""
    for t in heads:
        t.begin()
    backbone(batch, taps=[t.tap for t in heads])
    return [t.end(batch["attention_mask"]) for t in heads]


def replay(states, mask, heads, end=True, batched=True):
    """(h)/(t): the fused tap over stored hidden states (no base pass), then the heads' end() (end_all: the
    sequence heads of one shape batched, as in the one pass)."""
    for t in heads:
        t.begin()
    tap = shared_tap(heads)
    for i, z in enumerate(states):
        tap(i, z)
    if not end:
        return None
    return end_all(heads, mask) if batched else [t.end(mask) for t in heads]


def stacked(backbone, batch, heads):
    """(d): ask for all hidden states, then per head project every layer, stack, weight and sum."""
    out = backbone.model(**batch, output_hidden_states=True)
    logits = []
    for t in heads:
        m = t.mixer
        w = m.layer_weights()
        fs = torch.stack([m.project(i, z) for i, z in enumerate(out.hidden_states)])  # (L, B, T, k)
        F = m.finish((w[:, None, None, None] * fs).sum(0))
        logits.append(t.head(F, batch["attention_mask"]))
    return logits


def peak_bytes(fn) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    events = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                    if e.name() == "[memory]")
    live = peak = 0
    for _, n in events:
        live += n
        peak = max(peak, live)
    return peak


def operator_shares(fn, runs: int = 3, top: int = 8) -> list[dict]:
    """The operators taking most self CPU time over `runs` calls of fn: name, ms per call, share of the total."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(runs):
            fn()
    events = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in events)
    return [{"op": e.key, "ms_per_call": e.self_cpu_time_total / runs / 1e3, "share": e.self_cpu_time_total / total}
            for e in events[:top]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="minilm-l6")
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 512])
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5, help="timed repeats per configuration (0: memory only)")
    ap.add_argument("--configs", default=ALL, help=f"comma list from {ALL}")
    ap.add_argument("--early-layer", type=int, default=2, help="(e): the deepest layer its heads use")
    ap.add_argument("--no-memory", action="store_true", help="skip the memory measurement")
    ap.add_argument("--profile", action="store_true",
                    help="also split the (h) and (p) rows by operator (torch.profiler, self CPU time over 3 runs)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                    help="bf16: base and heads under bf16 autocast (worth it on CPUs with AVX512-BF16 or AMX)")
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    ap.add_argument("--out", default="benchmarks/results/one_pass",
                    help="writes OUT_<base>_T<length>.json and .md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    unknown = set(configs) - set(ALL.split(","))
    if unknown or "a" not in configs:
        sys.exit(f"--configs: must include a; unknown: {sorted(unknown)}")
    settings = {"base": args.base, "batch": args.batch, "repeats": args.repeats, "threads": args.threads,
                "configs": configs, "early_layer": args.early_layer, "torch": torch.__version__,
                "cpu": platform.processor() or platform.machine(), "device": "cpu",
                "precision": args.precision}
    autocast = autocast_for(args.precision, torch.device("cpu")) or nullcontext
    print("settings:", json.dumps(settings), flush=True)

    backbone = Backbone.load(args.base)
    L, d = backbone.num_layers, backbone.hidden_size
    from transformers import AutoModelForSequenceClassification

    copies = [AutoModelForSequenceClassification.from_pretrained(resolve(args.base), num_labels=2).eval()
              for _ in range(max([int(c[1:]) for c in configs if c.startswith("c")] or [0]))]
    seq = [make_head(backbone, "sequence", ["neg", "pos"], seed=i) for i in range(8)]
    mixed = [make_head(backbone, "sequence", ["unacceptable", "acceptable"], 10),
             make_head(backbone, "sequence", ["neg", "pos"], 11),
             make_head(backbone, "token", ["O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC",
                                           "I-MISC"], 12),
             make_head(backbone, "regression", [], 13)]
    early = [make_head(backbone, "sequence", ["neg", "pos"], 20, deepest=args.early_layer)]
    k = seq[0].cfg.mixer.k
    passes = {"mixed4": one_pass(backbone, mixed), "e": one_pass(backbone, early, primary=False),
              **{f"b{n}": one_pass(backbone, seq[:n]) for n in (1, 2, 4, 8)}}

    for T in args.lengths:
        batch = imdb_rows(Path(args.data), backbone.tokenizer, args.batch, T)
        B = batch["input_ids"].shape[0]
        with torch.inference_mode(), autocast():
            states = backbone.model(**batch, output_hidden_states=True).hidden_states  # Z_0..Z_L for (h), (t)
        run = {"a": lambda: backbone(batch),
               "mixed4": lambda: passes["mixed4"](batch),
               "l4": lambda: layer_by_layer(backbone, batch, seq[:4]),
               "lmixed4": lambda: layer_by_layer(backbone, batch, mixed),
               "u4": lambda: per_head(backbone, batch, seq[:4]),
               "h4": lambda: replay(states, batch["attention_mask"], seq[:4]),
               "p4": lambda: replay(states, batch["attention_mask"], seq[:4], batched=False),
               "hmixed4": lambda: replay(states, batch["attention_mask"], mixed),
               "t4": lambda: replay(states, batch["attention_mask"], seq[:4], end=False),
               "tmixed4": lambda: replay(states, batch["attention_mask"], mixed, end=False),
               "umixed4": lambda: per_head(backbone, batch, mixed),
               "e": lambda: passes["e"](batch)}
        for n in (1, 2, 4, 8):
            run[f"b{n}"] = lambda n=n: passes[f"b{n}"](batch)
            run[f"c{n}"] = lambda n=n: [c(**batch).logits for c in copies[:n]]
            run[f"d{n}"] = lambda n=n: stacked(backbone, batch, seq[:n])
        times = {c: [] for c in configs}
        with torch.inference_mode(), autocast():
            run["a"]()  # warm-up
            load = [round(os.getloadavg()[0], 2)]  # the machine's load before and after the timed repeats
            t_start = time.perf_counter()
            for r in range(args.repeats):
                order = configs[r % len(configs):] + configs[: r % len(configs)]
                for c in order:
                    t0 = time.perf_counter()
                    run[c]()
                    times[c].append(time.perf_counter() - t0)
                print(f"T={T} repeat {r + 1}/{args.repeats}: " + "  ".join(f"{c} {times[c][-1]:.2f}s" for c in configs),
                      flush=True)
            timing_s = time.perf_counter() - t_start
            load.append(round(os.getloadavg()[0], 2))
            profiles = {c: operator_shares(run[c]) for c in configs if args.profile and c[0] in "hp"}
            memory = {}
            if not args.no_memory:
                for c in [c for c in ("a", "b1", "b4", "d1", "d4", "e") if c in configs]:
                    memory[c] = peak_bytes(run[c])
                    print(f"T={T} memory {c}: peak {memory[c] / 2**20:.1f} MiB", flush=True)
        rows = []
        for c in configs:
            row = {"config": c}
            if args.repeats:
                row["median_s"] = statistics.median(times[c])
                row["ratio_to_a"] = statistics.median(t / a for t, a in zip(times[c], times["a"]))
                row["times_s"] = [round(t, 4) for t in times[c]]
            if c in memory:
                row["peak_mib"] = memory[c] / 2**20
                row["extra_mib"] = (memory[c] - memory["a"]) / 2**20
            rows.append(row)
        result = {"settings": {**settings, "length": T, "batch": B, "layers": L, "hidden": d, "k": k,
                               "timing_seconds": round(timing_s, 1), "load_average_1min": load,
                               "accumulator_mib_per_head": B * T * k * 4 / 2**20,
                               "all_states_mib": L * B * T * d * 4 / 2**20},
                  "rows": rows, "profiles": profiles}
        out = Path(f"{args.out}_{args.base}_T{T}")
        write_json(out.with_suffix(".json"), result)
        atomic_write(out.with_suffix(".md"), table(result))
        print(table(result), flush=True)
        print(f"wrote {out}.json and {out}.md", flush=True)


LABELS = {"a": "(a) base alone", "mixed4": "(b) base + 4 mixed heads (cola, imdb, conll-token, stsb)",
          "l4": "(l) as (b), 4 sequence heads, tapped at every layer during the pass (no deferral)",
          "lmixed4": "(l) as (b), 4 mixed heads, tapped at every layer during the pass (no deferral)",
          "u4": "(u) base + 4 sequence heads, one pass, a tap per head (not fused)",
          "umixed4": "(u) base + 4 mixed heads, a tap per head (not fused)",
          "h4": "(h) 4 sequence heads alone on stored states: fused tap + heads",
          "p4": "(p) as (h), 4 sequence heads, each head's end() on its own (attention not batched)",
          "hmixed4": "(h) 4 mixed heads alone on stored states: fused tap + heads",
          "t4": "(t) 4 sequence heads: the fused tap alone (GEMM, LayerNorm, mixing)",
          "tmixed4": "(t) 4 mixed heads: the fused tap alone",
          "e": "(e) early exit, 1 head on layers <= {L}"}
for _n in (1, 2, 4, 8):
    LABELS[f"b{_n}"] = f"(b) base + {_n} sequence head{'s' * (_n > 1)}, one pass"
    LABELS[f"c{_n}"] = f"(c) {_n} separate fine-tuned cop{'ies' if _n > 1 else 'y'} ({_n} passes)"
    LABELS[f"d{_n}"] = f"(d) output_hidden_states + stacking, {_n} head{'s' * (_n > 1)}"


def table(result: dict) -> str:
    s = result["settings"]
    lines = [f"### {s['base']}, batch {s['batch']} x {s['length']} tokens, CPU, {s['threads']} thread(s), "
             f"{s['repeats']} repeats, {s.get('precision', 'fp32')} (torch {s['torch']})", "",
             "| configuration | median s | time / (a) | peak MiB | extra MiB over (a) |", "|---|---:|---:|---:|---:|"]
    for r in result["rows"]:
        label = LABELS[r["config"]].format(L=s["early_layer"])
        t = f"{r['median_s']:.3f}" if "median_s" in r else "-"
        ratio = f"{r['ratio_to_a']:.3f}" if "ratio_to_a" in r else "-"
        peak = f"{r['peak_mib']:.1f}" if "peak_mib" in r else "-"
        extra = f"{r['extra_mib']:.1f}" if "extra_mib" in r and r["config"] != "a" else "-"
        lines.append(f"| {label} | {t} | {ratio} | {peak} | {extra} |")
    if "load_average_1min" in s:
        lines += ["", "Load average (1 min) before and after the timed repeats: "
                  f"{' and '.join(str(x) for x in s['load_average_1min'])} (on {os.cpu_count()} cores)."]
    lines += ["", f"One accumulator (B x T x k floats) = {s['accumulator_mib_per_head']:.1f} MiB; "
              f"all {s['layers']} hidden states (B x T x d) = {s['all_states_mib']:.1f} MiB."]
    rows = {r["config"]: r for r in result["rows"]}
    a = rows["a"].get("median_s")
    for c, ops in result.get("profiles", {}).items():
        lines += ["", f"{LABELS[c]}, by operator (torch.profiler, self CPU time; % of (a) from its median):", "",
                  "| operator | ms per call | share of the heads' time | % of (a) |", "|---|---:|---:|---:|"]
        lines += [f"| {o['op']} | {o['ms_per_call']:.1f} | {o['share']:.1%} | "
                  f"{o['ms_per_call'] / 1e3 / a:.1%} |" if a else f"| {o['op']} | {o['ms_per_call']:.1f} | "
                  f"{o['share']:.1%} | - |" for o in ops]
    for n in (1, 4):
        b, dd = rows.get(f"b{n}", {}), rows.get(f"d{n}", {})
        if b.get("extra_mib") and dd.get("extra_mib"):
            lines.append(f"Extra memory, {n} head(s): (d) / (b) = {dd['extra_mib'] / max(b['extra_mib'], 1e-9):.1f}x.")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
