"""The heads' own matrix products in bf16 or int8 at serving time: do the predictions stay, and is time saved?

    python benchmarks/head_precision.py runs/cola runs/conll --repeats 7 --out benchmarks/results/head_precision_minilm-l6

For each trained run folder: its test split scored from the hidden-state cache (the same stored states for
every scheme; built on first use) with the head's own products in

    fp32   as served now
    bf16   y = fp32(bf16(x) bf16(W)^T + bf16(b)), accumulated in fp32 (adalayers.model.bf16.linear, the
           products of train.head_precision=bf16)
    int8   torch dynamic quantization: W int8 per output channel (symmetric), x quantized per call (per tensor,
           reduce_range as torch's quantize_dynamic on x86), int32 accumulation (torch.ops.quantized.linear_dynamic)

Every product with a head's own weights changes: the mixer's projections W_i, the attention's in and out
projections, a token head's feed-forward, the output layer (calls of nnf.linear, and torch.baddbmm where
several sequence heads run batched). The attention's scores, GELU, LayerNorm and softmax stay fp32.
Reports the share of predictions equal to fp32's (labels per example; tags per word for token tasks), the
metric under each scheme, and the time of the heads' own work on stored states: one batch of B IMDB rows of
exactly T tokens (benchmarks/one_pass.py's rows), the base run once outside the timed interval, then the
fused tap and end() of all the given heads (one_pass.py's (h) row), every scheme once per repeat in rotating
order; the ratio is the median over repeats of a scheme's time / fp32's time in the same repeat. Prints
the CPU's bf16 instructions: without them (AVX2 only) bf16 products are emulated and slow.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from torch.overrides import TorchFunctionMode

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from adalayers import config  # noqa: E402
from adalayers.recipes import service  # noqa: E402
from adalayers.kinds import TaskKind  # noqa: E402
from adalayers.model import bf16  # noqa: E402
from adalayers.model.precision import cpu_bf16_flags  # noqa: E402
from adalayers.model.sidetask import over_states  # noqa: E402
from adalayers.recipes.evaluate import evaluate_split  # noqa: E402
from adalayers.store import run as runlib  # noqa: E402
from cpu_bf16 import agreement  # noqa: E402
from one_pass import imdb_rows  # noqa: E402

SCHEMES = ("fp32", "bf16", "int8")


class Products(TorchFunctionMode):
    """Inside: every nnf.linear and torch.baddbmm computed in bf16 or int8 (the heads' products; enter it only
    where no base runs)."""

    _packed: dict = {}

    def __init__(self, scheme: str):
        super().__init__()
        self.scheme = scheme

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.linear:
            x, w, b = (list(args) + [kwargs.get("bias")])[:3]
            return self.linear(x, w, b)
        if func is torch.baddbmm:  # sequence_heads: bias (H, 1, o), x (H, N, i), W^T (H, i, o)
            b, x, wt = args
            return torch.stack([self.linear(x[h], wt[h].t(), b[h, 0]) for h in range(x.shape[0])])
        return func(*args, **kwargs)

    def linear(self, x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor:
        if self.scheme == "bf16":
            return bf16.linear(x, w, b, torch.bfloat16)
        key = (id(w), None if b is None else id(b))  # the tensors are held below: ids stay theirs; weights never change here
        if key not in self._packed:
            scale = w.detach().abs().amax(1).clamp_min(1e-12) / 127
            q = torch.quantize_per_channel(w.detach().float(), scale.double(), torch.zeros(w.shape[0], dtype=torch.long),
                                           0, torch.qint8)
            self._packed[key] = (w, b, torch.ops.quantized.linear_prepack(q, None if b is None else b.detach().float()))
        y = torch.ops.quantized.linear_dynamic(x.reshape(-1, x.shape[-1]).contiguous(), self._packed[key][2], True)
        return y.view(*x.shape[:-1], w.shape[0])


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo (else the platform's processor string)."""
    try:
        return next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def scheme_context(scheme: str):
    return None if scheme == "fp32" else (lambda: Products(scheme))


def scored(run_dir: Path, overrides: list[str]) -> tuple[dict, object]:
    """The run's test split under every scheme, from the cache: metric, predictions agreeing with fp32."""
    cfg = config.from_dict(runlib.run_config(run_dir).to_dict(), ["train.device=cpu", "cache.enabled=true", *overrides])
    backbone, data, encoded = service.prepare(cfg)
    task, _, _ = runlib.load_head(run_dir, backbone)
    task.eval()
    source, pad_id = service.make_source(cfg, backbone, data, {"test": encoded["test"]}), backbone.tokenizer.pad_token_id or 0
    results = {s: evaluate_split(task, source, encoded["test"], data.splits["test"], cfg.train.eval_batch_size, pad_id,
                                 scheme_context(s)) for s in SCHEMES}
    row = {"run": str(run_dir), "task": data.name, "base": cfg.model.base, "k": cfg.mixer.k, "head": task.kind.value,
           "test_examples": len(data.splits["test"]), "main_metric": data.main_metric,
           "units": "words" if task.kind == TaskKind.TOKENS else "examples",
           "metric": {s: round(r[0][data.main_metric], 4) for s, r in results.items()},
           "agreement": {s: round(agreement(results["fp32"][1], r[1]), 5) for s, r in results.items() if s != "fp32"}}
    return row, (task, backbone)


def timed(tasks: list, backbone, data: Path, batch: int, length: int, repeats: int) -> dict:
    """The heads' own work (fused tap + end_all) on stored states of one batch, per scheme: median s, ratio to fp32."""
    rows = imdb_rows(data, backbone.tokenizer, batch, length)
    with torch.inference_mode():
        states = backbone.model(**rows, output_hidden_states=True).hidden_states
    mask = rows["attention_mask"]

    def heads():
        return over_states(tasks, states, mask)

    times = {s: [] for s in SCHEMES}
    with torch.inference_mode():
        for s in SCHEMES:  # warm-up (packs the int8 weights once)
            with Products(s) if s != "fp32" else torch.no_grad():
                heads()
        for r in range(repeats):
            for s in SCHEMES[r % 3:] + SCHEMES[:r % 3]:
                with Products(s) if s != "fp32" else torch.no_grad():
                    t0 = time.perf_counter()
                    heads()
                    times[s].append(time.perf_counter() - t0)
    return {s: {"median_s": round(statistics.median(v), 4),
                "ratio_to_fp32": round(statistics.median(t / f for t, f in zip(v, times["fp32"])), 3),
                "times_s": [round(t, 4) for t in v]} for s, v in times.items()}


def table(result: dict) -> str:
    env, t = result["env"], result["timing"]
    lines = [f"### The heads' own products in bf16 and int8 at serving time ({env['cpu']}, bf16 instructions: "
             f"{', '.join(env['bf16_flags']) or 'none'}, {env['threads']} thread(s), torch {env['torch']})", "",
             "| task | head | k | test | metric | fp32 | bf16 | int8 | agreeing with fp32: bf16 | int8 |",
             "|---|---|---:|---:|---|---:|---:|---:|---:|---:|"]
    for r in result["rows"]:
        m, a = r["metric"], r["agreement"]
        lines.append(f"| {r['task']} | {r['head']} | {r['k']} | {r['test_examples']:,} | {r['main_metric']} | "
                     f"{m['fp32']} | {m['bf16']} | {m['int8']} | {a['bf16']:.2%} of {r['units']} | {a['int8']:.2%} |")
    lines += ["", f"The heads' own work ({' + '.join(r['task'] for r in result['rows'])} heads: fused tap + heads) on "
              f"stored states of {env['batch']} x {env['length']} IMDB tokens, {env['repeats']} rotating repeats:", "",
              "| products | median s | time / fp32 |", "|---|---:|---:|"]
    lines += [f"| {s} | {v['median_s']:.4f} | {v['ratio_to_fp32']:.3f} |" for s, v in t.items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="trained run folders (heads of one base)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--data", default=str(ROOT.parent / "shared" / "data"), help="holds imdb/ for the timed batch")
    ap.add_argument("--set", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                    help="config overrides for every run, e.g. task.max_eval_examples=500")
    ap.add_argument("--out", default="benchmarks/results/head_precision")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", message=".*quantize_per_tensor, torch.quantize_per_channel.*")
    env = {"cpu": cpu_model(), "bf16_flags": cpu_bf16_flags(), "threads": args.threads,
           "torch": torch.__version__, "repeats": args.repeats, "batch": args.batch, "length": args.length,
           "overrides": args.set, "runs": [str(r) for r in args.runs]}
    print("settings:", json.dumps(env), flush=True)
    rows, tasks = [], []
    for run_dir in args.runs:
        row, (task, backbone) = scored(run_dir, args.set)
        torch.set_num_threads(args.threads)  # prepare() may set the run's own thread count
        print(json.dumps(row), flush=True)
        rows.append(row)
        tasks.append(task)
    result = {"env": env, "rows": rows,
              "timing": timed(tasks, backbone, Path(args.data), args.batch, args.length, args.repeats)}
    md = table(result)
    print(md)
    out = Path(args.out)
    runlib.write_json(out.with_suffix(".json"), result)
    runlib.atomic_write(out.with_suffix(".md"), md)


if __name__ == "__main__":
    main()
