"""The llama.cpp runtime against the default one (transformers, fp32) on the same GGUF base.

    states     per state i: relative difference |Z_llama - Z_torch| / |Z_torch| per token (max, mean) and the
               lowest cosine, over --sentences CoLA dev sentences (the GGUF's Q4_K_M weights run by llama.cpp
               against the same weights dequantized to fp32 in transformers)
    agreement  with --heads: each head's labels on the CoLA dev set (GLUE dev, the project's CoLA test set)
               from both runtimes, the share that agree and each runtime's MCC; each head's trained_on is the
               runtime its states came from in training (its model.runtime: torch, or llama.cpp)
    speed      generated tokens/s (greedy, eos ignored) at each batch size and number of new tokens, for:
               llama.cpp alone (no eval callback), llama.cpp + 1 head, + 4 heads, + 4 heads with per-step
               values, and the default runtime alone and + 4 heads; prompt (prefill) tokens/s of each runtime
               alone. Configurations rotate within each repeat; medians over repeats, and each one's time
               relative to its runtime alone in the same repeat.
    steps      process CPU time of each decode step (microseconds) at each batch size, for: llama.cpp alone
               (no eval callback), llama.cpp with its callback and no head (the node filter's own cost), + 4
               heads; with --engine-from DIR also the last two on the llama.cpp engine of another checkout's
               DIR/adalayers/infer/llamacpp.py (its callback against this one's, in the same process). The
               generations advance one step each in turn: paired steps, --step-tokens per repeat.
    memory     peak RSS of a process that loads each runtime and generates once with 4 heads (a subprocess each)

Heads for the speed runs have configs/cola.yaml's settings, initial weights and uniform layer weights (every
layer projected: the most work a head adds), as benchmarks/generation_overhead.py.

    nice python benchmarks/llamacpp_runtime.py --base gemma3-270m --heads runs/cola_gemma --threads 1

The code measured is this checkout's src/, or the one PYTHONPATH names when it is set (another checkout's
code under the same benchmark: PYTHONPATH=../main/src python benchmarks/llamacpp_runtime.py --skip ...).
Only the runtimes the parts not skipped use are loaded.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
if not os.environ.get("PYTHONPATH"):
    sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from adalayers.model.backbone import Backbone  # noqa: E402
from adalayers.infer.llamacpp_backbone import LlamaCppBackbone  # noqa: E402
from adalayers.store import run as runlib  # noqa: E402
from adalayers.store.run import write_json  # noqa: E402
from adalayers.infer.sidetasks import SideTasks  # noqa: E402
from generation_overhead import PROMPTS, heads_for  # noqa: E402


def cola_dev(n: int | None = None) -> tuple[list[str], list[str]]:
    """CoLA's GLUE dev set (the project's CoLA test split), read as configs/cola.yaml reads it."""
    from adalayers import config as config_mod
    from adalayers.data.tasks import load_task

    rows = load_task(config_mod.load(ROOT / "configs" / "cola.yaml")).splits["test"][:n]
    return [r.text for r in rows], [r.label for r in rows]


def states(torch_base: Backbone, llama_base: LlamaCppBackbone, texts: list[str]) -> dict:
    rel_max = np.zeros(torch_base.num_layers)
    rel_sum, cos_min, count = np.zeros(torch_base.num_layers), np.ones(torch_base.num_layers), 0
    for text in texts:
        batch = torch_base.tokenize([text], max_length=128)
        got = {}
        for name, base in (("torch", torch_base), ("llama", llama_base)):
            seen = {}
            base(batch, taps=[lambda i, z, seen=seen: seen.__setitem__(i, z[0].float().clone())])
            got[name] = seen
        for i in range(torch_base.num_layers):
            a, b = got["torch"][i], got["llama"][i]
            rel = ((a - b).norm(dim=-1) / a.norm(dim=-1).clamp(min=1e-12)).numpy()
            cos = torch.nn.functional.cosine_similarity(a, b, dim=-1).numpy()
            rel_max[i], rel_sum[i] = max(rel_max[i], rel.max()), rel_sum[i] + rel.sum()
            cos_min[i] = min(cos_min[i], cos.min())
        count += batch["input_ids"].shape[1]
    return {"sentences": len(texts), "tokens": count,
            "relative_difference_max": [round(float(x), 4) for x in rel_max],
            "relative_difference_mean": [round(float(x), 4) for x in rel_sum / count],
            "cosine_min": [round(float(x), 5) for x in cos_min]}


def agreement(torch_base, llama_base, heads: list[str], texts, labels) -> dict:
    from sklearn.metrics import matthews_corrcoef

    out = {}
    preds = {}
    for name, base in (("torch", torch_base), ("llama.cpp", llama_base)):
        side = SideTasks.from_backbone(base, heads, primary=False)  # rows per pass: the runtime's (rows_per_pass)
        t0 = time.perf_counter()
        res = side.predict(texts)
        preds[name] = {h: [r["tasks"][h]["label"] for r in res] for h in side.names}
        out[f"{name}_seconds"] = round(time.perf_counter() - t0, 1)
    runs = {Path(r).name: Path(r) for r in heads}  # a head's name is its run folder's
    for h in preds["torch"]:
        a, b = np.array(preds["torch"][h]), np.array(preds["llama.cpp"][h])
        out[h] = {"agreement": round(float((a == b).mean()), 4), "mcc_torch": round(matthews_corrcoef(labels, a), 4),
                  "mcc_llama.cpp": round(matthews_corrcoef(labels, b), 4), "rows": len(labels),
                  "trained_on": runlib.run_config(runs[h]).model.runtime}
    return out


def speed(sides: dict, batches: list[int], news: list[int], repeats: int) -> dict:
    configs = {"llama.cpp": ("llama_alone", [], False), "llama.cpp+1": ("llama", ["head0"], False),
               "llama.cpp+4": ("llama", ["head0", "head1", "head2", "head3"], False),
               "llama.cpp+4/steps": ("llama", ["head0", "head1", "head2", "head3"], True),
               "torch": ("torch", [], False), "torch+4": ("torch", ["head0", "head1", "head2", "head3"], False)}
    alone = {"llama.cpp+1": "llama.cpp", "llama.cpp+4": "llama.cpp", "llama.cpp+4/steps": "llama.cpp",
             "torch+4": "torch", "torch": "llama.cpp"}
    out = {}
    for bs in batches:
        for new in news:
            prompts = PROMPTS[:bs]
            times, ratios, order = {c: [] for c in configs}, {c: [] for c in alone}, list(configs)
            for rep in range(repeats):
                order = order[1:] + order[:1]
                mine = {}
                for c in order:
                    side, names, steps = sides[configs[c][0]], configs[c][1], configs[c][2]
                    t0 = time.perf_counter()
                    res = side.generate(prompts, new, names, steps=steps, ignore_eos=True)
                    mine[c] = time.perf_counter() - t0
                    assert sum(r["tokens"] for r in res) == bs * new
                    times[c].append(mine[c])
                for c, ref in alone.items():
                    ratios[c].append(mine[c] / mine[ref])
                print(f"batch {bs} new {new} repeat {rep + 1}: "
                      + ", ".join(f"{c} {mine[c]:.2f}s" for c in configs), flush=True)
            out[f"batch {bs}, {new} new tokens"] = {
                "tokens_per_s": {c: round(bs * new / statistics.median(v), 1) for c, v in times.items()},
                "time_vs_alone": {c: round(statistics.median(v), 3) for c, v in ratios.items()},
                "note": "time_vs_alone: +heads against the same runtime alone; 'torch' against llama.cpp alone"}
    return out


def steps(sides: dict, batches: list[int], new: int, repeats: int) -> dict:
    """Process CPU time of each decode step, us: one generation per configuration, advanced one step at a time in
    turn (rotating order), the prefill and the final predictions left out; medians over all steps of all
    repeats, and the median over steps of each one's ratio to llama.cpp alone's step of the same round."""
    from adalayers.infer.generate import stream

    four = ["head0", "head1", "head2", "head3"]
    configs = {"llama.cpp alone": ("llama_alone", []), "callback, 0 heads": ("llama", []),
               "+ 4 heads": ("llama", four)}
    if "other" in sides:
        configs.update({"callback, 0 heads (--engine-from)": ("other", []),
                        "+ 4 heads (--engine-from)": ("other", four)})
    out = {}
    for bs in batches:
        us, ratios = {c: [] for c in configs}, {c: [] for c in configs}
        for rep in range(repeats):
            gens = {c: stream(sides[side], PROMPTS[:bs], new, names, ignore_eos=True)
                    for c, (side, names) in configs.items()}
            for g in gens.values():
                assert next(g)["event"] == "prompt"  # the prefill, not measured
            order = list(configs)
            for k in range(new):
                order, mine = order[1:] + order[:1], {}
                for c in order:
                    c0 = time.process_time()
                    assert next(gens[c])["event"] == "step"
                    mine[c] = (time.process_time() - c0) * 1e6
                for c in configs:
                    us[c].append(mine[c])
                    ratios[c].append(mine[c] / mine["llama.cpp alone"])
            for g in gens.values():
                g.close()
            print(f"steps, batch {bs} repeat {rep + 1}: "
                  + ", ".join(f"{c} {statistics.median(us[c][-new:]):.0f} us" for c in configs), flush=True)
        out[f"batch {bs}"] = {"cpu_us_per_step": {c: round(statistics.median(v)) for c, v in us.items()},
                              "cpu_vs_alone": {c: round(statistics.median(v), 3) for c, v in ratios.items()}}
    return {**out, "steps_per_repeat": new, "note": "process CPU time per decode step, 1 thread; medians over steps"}


def other_engine(llama: SideTasks, src: Path, threads: int) -> SideTasks:
    """The llama side's heads on the same GGUF, run by the llama.cpp engine (its eval callback) of another
    checkout's src/adalayers/infer/llamacpp.py, loaded beside this one's."""
    spec = importlib.util.spec_from_file_location("llamacpp_other", src / "adalayers" / "infer" / "llamacpp.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    base, engine = llama.backbone, llama.backbone.engine
    other = module.LlamaCpp(base.path, n_ctx=engine.n_ctx, n_seq=engine.n_seq, n_batch=engine.n_batch, threads=threads)
    return SideTasks(LlamaCppBackbone(other, base.tokenizer, base.name, base.path), list(llama.heads.values()),
                     primary=False, max_length=64)


def prefill(sides: dict, repeats: int) -> dict:
    """Prompt tokens/s of each runtime alone: 8 prompts, the base's pass only (no head)."""
    tok_count = sum(len(sides["torch"].backbone.tokenizer(p)["input_ids"]) for p in PROMPTS)
    out = {}
    for name in ("llama_alone", "torch"):
        side, ts = sides[name], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            side.generate(PROMPTS, 1, [], ignore_eos=True)
            ts.append(time.perf_counter() - t0)
        out[name] = round(tok_count / statistics.median(ts), 1)
    return {"prompt_tokens": tok_count, "tokens_per_s": out,
            "note": "8 prompts in one batch, one generated token (the prefill dominates)"}


def peak_rss(runtime: str, base: str, threads: int) -> float:
    """MB: a fresh process loads the runtime with 4 heads and generates 24 tokens for one prompt."""
    # VmHWM, the process's own peak (ru_maxrss would carry this parent's peak over the fork)
    code = (f"import sys, torch; sys.path[:0] = [{str(ROOT / 'src')!r}, {str(ROOT / 'benchmarks')!r}]; "
            f"torch.set_num_threads({threads}); from llamacpp_runtime import load_side; "
            f"s = load_side({runtime!r}, {base!r}, {threads}); "
            f"s.generate(['The history of the city begins in'], 24, ignore_eos=True); "
            f"print([l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')][0])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return round(int(out.stdout.strip().splitlines()[-1]) / 1024, 1)


def load_side(runtime: str, base: str, threads: int, n_heads: int = 4) -> SideTasks:
    if runtime == "torch":
        backbone = Backbone.load(base, "decoder")
    else:
        backbone = LlamaCppBackbone.load(base, threads=threads, read_states=runtime != "llama_alone")
    return SideTasks(backbone, heads_for(backbone, n_heads) if runtime != "llama_alone" else [], primary=False,
                     max_length=64)


def _relative(path: str) -> str:
    """A path inside the repository as relative to it (results never hold this machine's folders)."""
    p = Path(path).resolve()
    return str(p.relative_to(ROOT)) if p.is_relative_to(ROOT) else p.name


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="gemma3-270m")
    ap.add_argument("--heads", nargs="*", default=[], help="trained run folders for the agreement table")
    ap.add_argument("--sentences", type=int, default=200)
    ap.add_argument("--batch", default="1,4")
    ap.add_argument("--new", default="24,128")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--step-tokens", type=int, default=32, help="decode steps per repeat of the steps part")
    ap.add_argument("--engine-from", type=Path, help="steps: another checkout's src/, its llama.cpp engine beside")
    ap.add_argument("--skip", default="", help="comma-separated parts to skip: states,agreement,speed,steps,memory")
    ap.add_argument("--out", default="benchmarks/results/llamacpp_runtime.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    skip = set(filter(None, args.skip.split(",")))
    uses = {"states": {"torch", "llama"}, "agreement": {"torch", "llama"} if args.heads else set(),
            "speed": {"torch", "llama", "llama_alone"}, "steps": {"llama", "llama_alone"}}
    needed = set().union(*(v for k, v in uses.items() if k not in skip))
    sides = {name: load_side(name, args.base, args.threads) for name in ("torch", "llama", "llama_alone")
             if name in needed}
    settings = {**vars(args), "heads": [Path(h).name for h in args.heads], "out": _relative(args.out),
                "engine_from": args.engine_from and _relative(args.engine_from)}
    results = {"settings": {**settings, "torch": torch.__version__, "machine": platform.processor() or platform.machine(),
                            "load_average": [round(x, 1) for x in __import__("os").getloadavg()]}}
    if "states" not in skip:
        results["states"] = states(sides["torch"].backbone, sides["llama"].backbone, cola_dev(args.sentences)[0])
        print(json.dumps(results["states"]), flush=True)
    if args.heads and "agreement" not in skip:
        texts, labels = cola_dev()
        results["agreement"] = agreement(sides["torch"].backbone, sides["llama"].backbone, args.heads, texts, labels)
        print(json.dumps(results["agreement"]), flush=True)
    if "speed" not in skip:
        results["prefill"] = prefill(sides, args.repeats)
        results["speed"] = speed(sides, [int(b) for b in args.batch.split(",")], [int(n) for n in args.new.split(",")],
                                 args.repeats)
    if "steps" not in skip:
        if args.engine_from:
            sides["other"] = other_engine(sides["llama"], args.engine_from, args.threads)
        results["steps"] = steps(sides, [int(b) for b in args.batch.split(",")], args.step_tokens, args.repeats)
    if "memory" not in skip:
        del sides
        results["peak_rss_mb"] = {r: peak_rss(r, args.base, args.threads) for r in ("llama_alone", "llama", "torch")}
    out = Path(args.out)
    write_json(out if out.is_absolute() else ROOT / out, results)
    print(json.dumps({k: v for k, v in results.items() if k != "settings"}, indent=1))


if __name__ == "__main__":
    main()
