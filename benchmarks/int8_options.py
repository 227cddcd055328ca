"""int8 schemes compared: which nodes ONNX Runtime's dynamic quantization touches, and how.

    python benchmarks/int8_options.py --heads cola=../runs/cola conll=../runs/conll

Exports the base + heads once (fp32), writes one int8 copy per scheme of adalayers.export.int8
(INT8_SCHEMES: per-channel or per-tensor weights, reduce_range, uint8 weights, and which of the
base's MatMuls are quantized), then scores every head on its full test split through PyTorch fp32,
ONNX Runtime fp32 and each int8 copy: the head's metric (CoLA MCC, CoNLL entity F1) and the share of
predictions (labels, or word tags) equal to PyTorch fp32's. Also the time of one batch of B x T
tokens (every backend once per repeat, rotating order, ratio to PyTorch's time in the same repeat,
median over repeats) and each graph's size. Writes benchmarks/results/int8_options_<base>.json/.md.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from adalayers.model.backbone import Backbone  # noqa: E402
from adalayers.export.int8 import DEFAULT_INT8, INT8_SCHEMES, quantize  # noqa: E402
from adalayers.export.onnx import MODEL, export  # noqa: E402
from adalayers.infer.sidetasks import SideTasks, parse_heads  # noqa: E402
from backends import add_run_args, quality, save, start, timing  # noqa: E402
from one_pass import imdb_rows  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="minilm-l6")
    ap.add_argument("--heads", nargs="+", required=True, help="NAME=RUN folders")
    ap.add_argument("--schemes", nargs="+", default=list(INT8_SCHEMES), choices=list(INT8_SCHEMES))
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="timed repeats (0: no timing, quality only)")
    add_run_args(ap, "int8_options")
    args = ap.parse_args()
    settings = start(args, default_scheme=DEFAULT_INT8)
    base = Backbone.load(args.base)
    heads = parse_heads(args.heads, "--heads")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "exported"
        export(base, heads, folder)
        sides = {"torch": SideTasks.from_backbone(base, heads),
                 "onnx": SideTasks.open_export(folder, threads=args.threads)}
        schemes = {}
        for name in args.schemes:
            file = f"model.{name}.onnx"
            nodes = quantize(folder / MODEL, folder / file, name)
            schemes[name] = {"nodes_quantized": len(nodes), "mib": (folder / file).stat().st_size / 2**20,
                             "about": INT8_SCHEMES[name].about}
            sides[f"int8:{name}"] = SideTasks.open_export(folder, threads=args.threads, graph=file)
        fp32_mib = (folder / MODEL).stat().st_size / 2**20
        batch = imdb_rows(Path(args.data), base.tokenizer, args.batch, args.length) if args.repeats else None
        t0 = time.perf_counter()
        times = timing(sides, batch, [h.name for h in heads], args.repeats) if args.repeats else {k: {} for k in sides}
        print(f"timing took {time.perf_counter() - t0:.0f} s", flush=True)
        scores = []
        for h in heads:
            t0 = time.perf_counter()
            scores.append(quality(sides, h.name, h.path, args.limit))
            print(json.dumps(scores[-1]), f"({time.perf_counter() - t0:.0f} s)", flush=True)
    save({"settings": settings, "fp32_mib": fp32_mib, "schemes": schemes, "timing": times, "quality": scores},
         args, table)


def table(result: dict) -> str:
    s = result["settings"]
    metric = {q["task"]: ("f1" if "f1" in q["torch"] else "mcc") for q in result["quality"]}
    head = " | ".join(f"{q['task']} {metric[q['task']]} (agreement, n={q['n']})" for q in result["quality"])
    sets = f"the first {s['limit']} test examples of each task" if s["limit"] else "full test sets"
    timed = (f"time at {s['batch']} x {s['length']} tokens with every head, CPU, {s['threads']} thread(s), median of "
             f"{s['repeats']}" if s["repeats"] else "not timed")
    lines = [f"### {s['base']}: int8 schemes against PyTorch fp32 ({sets}; {timed}; torch {s['torch']}, "
             f"onnxruntime {s['onnxruntime']})", "",
             f"| backend | nodes int8 | MiB | time / PyTorch | {head} |",
             "|---|---:|---:|---:|" + "---:|" * len(result["quality"])]
    for key, t in result["timing"].items():
        sc = result["schemes"].get(key.removeprefix("int8:"), {}) if key.startswith("int8:") else {}
        cells = []
        for q in result["quality"]:
            m = q[key][metric[q["task"]]]
            cells.append(f"{m:.4f}" + (f" ({q[key]['agreement_with_torch']:.4f})" if key != "torch" else ""))
        size = f"{sc['mib']:.1f}" if sc else (f"{result['fp32_mib']:.1f}" if key == "onnx" else "-")
        name = f"{key} (default)" if key == "int8:" + s["default_scheme"] else key
        ratio = f"{t['ratio_to_torch']:.2f}" if t else "-"
        lines.append(f"| {name} | {sc.get('nodes_quantized', 0)} | {size} | {ratio} | "
                     + " | ".join(cells) + " |")
    lines += ["", "Schemes: " + "; ".join(f"`{k}`: {v['about']}" for k, v in result["schemes"].items()) + "."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
