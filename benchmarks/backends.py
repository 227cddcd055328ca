"""PyTorch fp32 vs ONNX Runtime fp32 vs ONNX Runtime int8: time per batch and full test-set quality.

    python benchmarks/backends.py --heads cola=../runs/cola conll=../runs/conll

Time: batches of B x T tokens (T = 128, real IMDB reviews packed so every row is full; B = 1 and 32),
with 1 head (the first) and 4 heads (the given heads, repeated under other names when fewer than 4:
the same work as 4 distinct heads). Each repeat runs every backend once, in a rotating order; a
backend's ratio is the median over repeats of its time / PyTorch's time in the same repeat. All
three answer through the same Predictor, each a Runtime (runtime.forward: one batch -> base output + every head's logits).

--fresh-heads (a base without trained heads, e.g. mpnet-base): freshly initialised heads with the
shapes of configs/cola.yaml (sequence) and configs/conll.yaml (token) stand in for the timing (their
weights do not change the work); no quality is measured then.

Quality: each head's metric on its task's full test split through each backend (CoLA MCC, CoNLL
entity F1 via the project's metrics), and the share of predictions (labels, or word tags) that
equal PyTorch fp32's. Writes benchmarks/results/backends_<base>.json and .md.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from adalayers import config as configlib  # noqa: E402
from adalayers import metrics  # noqa: E402
from adalayers.store import run as runlib  # noqa: E402
from adalayers.model.backbone import Backbone  # noqa: E402
from adalayers.export.int8 import DEFAULT_INT8  # noqa: E402
from adalayers.export.onnx import export  # noqa: E402
from adalayers.infer.sidetasks import HeadSpec, SideTasks, parse_heads  # noqa: E402
from adalayers.data.tasks import load_task  # noqa: E402
from adalayers.lab.portable import data_setting  # noqa: E402
from adalayers.data.tasks.fetch import data_folder  # noqa: E402
from one_pass import imdb_rows  # noqa: E402

BACKENDS = ["torch", "onnx", "onnx-int8"]


def sides(base: Backbone, heads: list[HeadSpec], folder: Path, threads: int) -> dict:
    return {"torch": SideTasks.from_backbone(base, heads),
            "onnx": SideTasks.open_export(folder, threads=threads),
            "onnx-int8": SideTasks.open_export(folder, int8=True, threads=threads)}


def fresh_heads(base: Backbone, folder: Path) -> list[str]:
    """NAME=RUN folders of freshly initialised heads shaped as configs/cola.yaml and configs/conll.yaml."""
    from adalayers.model.sidetask import SideTask

    labels = {"cola": ["unacceptable", "acceptable"],
              "conll": ["O", "B-LOC", "I-LOC", "B-MISC", "I-MISC", "B-ORG", "I-ORG", "B-PER", "I-PER"]}
    out = []
    for name, kind in (("cola", "sequence"), ("conll", "token")):
        cfg = configlib.load(ROOT / "configs" / f"{name}.yaml")
        cfg.head.kind, cfg.model.base = kind, base.name
        torch.manual_seed(0)
        task = SideTask(cfg, base.num_layers, base.hidden_size, labels[name])
        run = folder / name
        run.mkdir(parents=True)
        runlib.save_config(run, cfg, labels[name], base, runlib.save_head(run, task), task=name, kind=kind)
        out.append(f"{name}={run}")
    return out


def timing(all_sides: dict, batch: dict, names: list[str], repeats: int) -> dict:
    """Each backend of all_sides (the first is the reference) once per repeat, in rotating order."""
    keys = list(all_sides)
    times = {b: [] for b in keys}
    for b in keys:  # warm-up
        s = all_sides[b]
        s._forward(batch, [s.heads[n] for n in names], None)
    with torch.inference_mode():
        for r in range(repeats):
            for b in keys[r % len(keys):] + keys[: r % len(keys)]:
                s = all_sides[b]
                t0 = time.perf_counter()
                s._forward(batch, [s.heads[n] for n in names], None)
                times[b].append(time.perf_counter() - t0)
    return {b: {"median_s": statistics.median(times[b]),
                "ratio_to_torch": statistics.median(t / p for t, p in zip(times[b], times[keys[0]])),
                "times_s": [round(t, 4) for t in times[b]]} for b in keys}


def quality(all_sides: dict, name: str, run: Path, limit: int | None, split: str = "test") -> dict:
    """The head's metric on the split through each backend of all_sides, and agreement with the first's."""
    keys = list(all_sides)
    cfg = runlib.run_config(run)
    data = load_task(cfg)
    test = data.splits[split][:limit] if limit else data.splits[split]
    texts = [" ".join(e.words) if data.kind == "token" else e.text for e in test]
    out = {"task": data.name, "split": split, "n": len(test)}
    preds = {}
    for b in keys:
        res = all_sides[b].predict(texts, tasks=[name])
        if data.kind == "token":
            preds[b] = [r["tasks"][name]["tags"] for r in res]
            out[b] = {"f1": metrics.entities([e.tags for e in test], preds[b])["f1"]}
        else:
            preds[b] = [r["tasks"][name]["label"] for r in res]
            m = metrics.classification([data.labels.index(e.label) for e in test],
                                       [data.labels.index(p) for p in preds[b]], data.labels)
            out[b] = {"mcc": m["mcc"], "accuracy": m["accuracy"]}
    for b in keys[1:]:
        if data.kind == "token":
            pairs = [(x, y) for a, c in zip(preds[keys[0]], preds[b]) for x, y in zip(a, c)]
        else:
            pairs = list(zip(preds[keys[0]], preds[b]))
        out[b]["agreement_with_torch"] = sum(x == y for x, y in pairs) / len(pairs)
    return out


def add_run_args(ap: argparse.ArgumentParser, out_name: str) -> None:
    """The options every backend benchmark shares (this script and int8_options.py)."""
    ap.add_argument("--length", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1, help="torch and ONNX Runtime intra-op threads")
    ap.add_argument("--limit", type=int, default=None, help="score only the first N test examples (default all)")
    ap.add_argument("--data", default=str(data_folder(None)), help="the data folder (default: $ADALAYERS_DATA, else ../shared/data)")
    ap.add_argument("--out", default=f"benchmarks/results/{out_name}")


def start(args, **extra) -> dict:
    """Set the threads, print and return the settings line of a run."""
    torch.set_num_threads(args.threads)
    import onnxruntime

    settings = {**{k: v for k, v in vars(args).items() if k != "out"}, "torch": torch.__version__,
                "onnxruntime": onnxruntime.__version__, "cpu": platform.processor() or platform.machine(), **extra}
    settings["data"] = data_setting(args.data, ROOT)  # the data folder as $ADALAYERS_DATA
    print("settings:", json.dumps(settings), flush=True)
    return settings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="minilm-l6")
    ap.add_argument("--heads", nargs="+", default=[], help="NAME=RUN folders (the first is the 1-head case)")
    ap.add_argument("--fresh-heads", action="store_true",
                    help="time fresh cola- and conll-shaped heads instead (no trained heads for this base; no quality)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--repeats", type=int, default=7)
    add_run_args(ap, "backends")
    args = ap.parse_args()
    settings = start(args, int8_scheme=DEFAULT_INT8)
    if bool(args.heads) == args.fresh_heads:
        sys.exit("give --heads NAME=RUN ... or --fresh-heads")
    base = Backbone.load(args.base)
    fresh_dir = tempfile.TemporaryDirectory()
    given = parse_heads(fresh_heads(base, Path(fresh_dir.name)) if args.fresh_heads else args.heads, "--heads")
    four = (given * 4)[:4]
    heads = [HeadSpec(h.name if i < len(given) else f"{h.name}{i + 1}", h.path) for i, h in enumerate(four)]
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        export(base, heads, Path(tmp) / "exported", int8=True)
        settings["export_seconds"] = round(time.perf_counter() - t0, 1)
        sizes = {f: (Path(tmp) / "exported" / f).stat().st_size / 2**20 for f in ("model.onnx", "model.int8.onnx")}
        all_sides = sides(base, heads, Path(tmp) / "exported", args.threads)
        rows = []
        for B in args.batches:
            batch = imdb_rows(Path(args.data), base.tokenizer, B, args.length)
            for n in (1, 4):
                names = [h.name for h in heads[:n]]
                t = timing(all_sides, batch, names, args.repeats)
                rows.append({"batch": B, "length": args.length, "heads": n, **t})
                print(f"B={B} heads={n}: " + "  ".join(f"{b} {t[b]['median_s']:.4f}s x{t[b]['ratio_to_torch']:.3f}"
                                                       for b in BACKENDS), flush=True)
        scores = [] if args.fresh_heads else [quality(all_sides, h.name, h.path, args.limit) for h in given]
        for s in scores:
            print(json.dumps(s), flush=True)
    save({"settings": settings, "model_mib": sizes, "timing": rows, "quality": scores}, args, table)


def save(result: dict, args, table) -> None:
    """OUT_<base>.json with every setting and number, OUT_<base>.md with the table; the table printed."""
    out = Path(f"{args.out}_{args.base}")
    runlib.write_json(out.with_suffix(".json"), result)
    runlib.atomic_write(out.with_suffix(".md"), table(result))
    print(table(result))


def table(result: dict) -> str:
    s = result["settings"]
    lines = [f"### {s['base']}: PyTorch fp32 vs ONNX Runtime fp32 / int8 ({s.get('int8_scheme', 'base')} scheme) "
             f"(CPU, {s['threads']} thread(s), "
             f"median of {s['repeats']} repeats; torch {s['torch']}, onnxruntime {s['onnxruntime']})", "",
             "| batch x tokens | heads | PyTorch s | ORT fp32 s (ratio) | ORT int8 s (ratio) |", "|---|---:|---:|---:|---:|"]
    for r in result["timing"]:
        lines.append(f"| {r['batch']} x {r['length']} | {r['heads']} | {r['torch']['median_s']:.4f} | "
                     f"{r['onnx']['median_s']:.4f} ({r['onnx']['ratio_to_torch']:.2f}) | "
                     f"{r['onnx-int8']['median_s']:.4f} ({r['onnx-int8']['ratio_to_torch']:.2f}) |")
    if not result["quality"]:
        lines += ["", "Fresh (untrained) heads shaped as configs/cola.yaml and configs/conll.yaml: timing only."]
    else:
        lines += ["", "| head (test set) | metric | PyTorch | ORT fp32 (agreement) | ORT int8 (agreement) |",
                  "|---|---|---:|---:|---:|"]
    for q in result["quality"]:
        metric = "f1" if "f1" in q["torch"] else "mcc"
        lines.append(f"| {q['task']} ({q['n']}) | {metric} | {q['torch'][metric]:.4f} | "
                     f"{q['onnx'][metric]:.4f} ({q['onnx']['agreement_with_torch']:.4f}) | "
                     f"{q['onnx-int8'][metric]:.4f} ({q['onnx-int8']['agreement_with_torch']:.4f}) |")
    m = result["model_mib"]
    lines += ["", f"Graph size: fp32 {m['model.onnx']:.1f} MiB, int8 {m['model.int8.onnx']:.1f} MiB "
              f"(4 heads); export took {s['export_seconds']} s."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
