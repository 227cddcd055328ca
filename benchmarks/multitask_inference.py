"""Inference for SST-5, QQP and STS-B together: one shared AdaLayers pass against one pass per fine-tuned model.

The workload: N sentence pairs (the STS-B GLUE dev pairs, the comparison's test set), each to get
all three tasks' predictions, in batches sorted by length (the evaluation order).

    (a) base alone           one pass of the frozen base over the cross-encoded pair (reference)
    (s) AdaLayers, shared    one pass of the frozen base, the three AdaLayers heads fed by layer taps
                             (the pass stops after the deepest layer any head uses)
    (f) 3 fine-tuned models  one full pass per task: three fine-tuned copies of the base, each with
                             its task's classifier (5 classes, 2 classes, 1 value), on the pair
    (m) multi-task, bi-enc.  the seed reports' layout: one fine-tuned base shared by the three heads,
                             sentence 1 and sentence 2 each encoded on their own (two passes)

(s) uses the trained heads of a compare-multitask run (--run DIR: DIR/adalayers/<task>), so their
learned layer weights decide where the pass can stop; without --run, fresh heads with every layer in
use (the most work a head can add). (f) and (m) run the base's architecture with fresh weights:
fine-tuning changes weights, not work. Each repeat runs every configuration once, in a rotating
order; the ratio of a configuration is the median over repeats of its time / (s)'s time in that repeat.

    python benchmarks/multitask_inference.py --run runs/multitask-full --pairs 256 --repeats 5
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

from adalayers.store import run as runlib  # noqa: E402
from adalayers.model.backbone import Backbone, resolve  # noqa: E402
from adalayers import config  # noqa: E402
from adalayers.config import Config  # noqa: E402
from adalayers.kinds import TaskKind  # noqa: E402
from adalayers.model.sidetask import SideTask  # noqa: E402
from one_pass import one_pass  # noqa: E402

TASKS = {"sst5": (TaskKind.CLASSIFICATION, ["very negative", "negative", "neutral", "positive", "very positive"]),
         "qqp": (TaskKind.CLASSIFICATION, ["not_duplicate", "duplicate"]), "stsb": (TaskKind.REGRESSION, [])}
ORDER = ("a", "s", "f", "m")
LABELS = {"a": "(a) frozen base alone, 1 pass (reference)",
          "s": "(s) AdaLayers: 1 shared pass, 3 heads",
          "f": "(f) 3 fine-tuned models, 1 pass each",
          "m": "(m) multi-task fine-tuned, bi-encoder: 2 passes (one per sentence)"}


def stsb_pairs(data: Path, n: int) -> list[tuple[str, str]]:
    """The first n pairs of the STS-B GLUE dev set (the task's test split), read by the library's stsb task."""
    from adalayers.data.tasks import load_task

    test = load_task(config.from_dict({"task": {"name": "stsb", "data_dir": str(data)}})).splits["test"]
    if len(test) < n:
        sys.exit(f"--pairs {n}: the STS-B dev set has {len(test)}")
    return [(e.text, e.text_pair) for e in test[:n]]


def batches(tokenizer, texts_a, texts_b, batch: int, max_length: int) -> list[dict]:
    """Length-sorted batches of the pairs (or of single sentences when texts_b is None)."""
    key = [len(tokenizer(a, b)["input_ids"]) if b is not None else len(tokenizer(a)["input_ids"])
           for a, b in zip(texts_a, texts_b or [None] * len(texts_a))]
    order = sorted(range(len(texts_a)), key=key.__getitem__)
    out = []
    for s in range(0, len(order), batch):
        idx = order[s: s + batch]
        enc = tokenizer([texts_a[i] for i in idx], [texts_b[i] for i in idx] if texts_b else None,
                        truncation=True, max_length=max_length, padding=True, return_tensors="pt")
        out.append({k: enc[k] for k in ("input_ids", "attention_mask", "token_type_ids") if k in enc})
    return out


def heads(backbone, run: Path | None) -> tuple[list[SideTask], str]:
    if run is not None:
        return [runlib.load_head(run / "adalayers" / t, backbone)[0].eval() for t in TASKS], f"trained ({run})"
    out = []
    for i, (t, (kind, labels)) in enumerate(TASKS.items()):
        cfg = Config()
        cfg.head.kind = kind
        torch.manual_seed(i)
        out.append(SideTask(cfg, backbone.num_layers, backbone.hidden_size, labels).eval())
    return out, "fresh, every layer in use"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="minilm-l6")
    ap.add_argument("--run", help="a compare-multitask output folder with trained AdaLayers heads")
    ap.add_argument("--pairs", type=int, default=256)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--max-length", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--data", default=os.environ.get("ADALAYERS_DATA", str(ROOT.parent / "shared" / "data")))
    ap.add_argument("--out", default="benchmarks/results/multitask/inference",
                    help="writes OUT.json and OUT.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForSequenceClassification

    backbone = Backbone.load(args.base)
    tasks, which = heads(backbone, Path(args.run) if args.run else None)
    pairs = stsb_pairs(Path(args.data), args.pairs)
    a, b = [p[0] for p in pairs], [p[1] for p in pairs]
    tok = backbone.tokenizer
    cross = batches(tok, a, b, args.batch, args.max_length)
    singles = batches(tok, a, None, args.batch, args.max_length) + batches(tok, b, None, args.batch, args.max_length)
    fine_tuned = [AutoModelForSequenceClassification.from_pretrained(resolve(args.base), num_labels=n).eval()
                  for n in (5, 2, 1)]
    shared_base = fine_tuned[0].base_model
    shared = one_pass(backbone, tasks, primary=False)  # the pass users run: Predictor.forward, every head tapping it
    run = {"a": lambda: [backbone(x) for x in cross],
           "s": lambda: [shared(x) for x in cross],
           "f": lambda: [m(**x).logits for x in cross for m in fine_tuned],
           "m": lambda: [shared_base(**x) for x in singles]}
    settings = {"base": args.base, "pairs": args.pairs, "batch": args.batch, "max_length": args.max_length,
                "repeats": args.repeats, "threads": args.threads, "heads": which,
                "deepest_layer": max(max(t.used_layers()) for t in tasks), "layers": backbone.num_layers - 1,
                "torch": torch.__version__, "cpu": platform.processor() or platform.machine(), "device": "cpu",
                "command": "python benchmarks/multitask_inference.py " + " ".join(sys.argv[1:])}
    print("settings:", json.dumps(settings), flush=True)
    times = {c: [] for c in ORDER}
    with torch.inference_mode():
        run["a"]()  # warm-up
        for r in range(args.repeats):
            for c in ORDER[r % len(ORDER):] + ORDER[: r % len(ORDER)]:
                t0 = time.perf_counter()
                run[c]()
                times[c].append(time.perf_counter() - t0)
            print(f"repeat {r + 1}/{args.repeats}: " + "  ".join(f"{c} {times[c][-1]:.2f}s" for c in ORDER), flush=True)
    rows = [{"config": c, "label": LABELS[c], "median_s": statistics.median(times[c]),
             "ratio_to_shared": statistics.median(t / s for t, s in zip(times[c], times["s"])),
             "pairs_per_s": args.pairs / statistics.median(times[c]), "times_s": [round(t, 4) for t in times[c]]}
            for c in ORDER]
    result = {"settings": settings, "rows": rows}
    out = Path(args.out)
    runlib.write_json(out.with_suffix(".json"), result)
    runlib.atomic_write(out.with_suffix(".md"), table(result))
    print(table(result))


def table(result: dict) -> str:
    s = result["settings"]
    lines = [f"{s['pairs']} STS-B dev pairs, all three tasks each; {s['base']}, batch {s['batch']}, max_length "
             f"{s['max_length']}, CPU, {s['threads']} thread(s), {s['repeats']} repeats; AdaLayers heads "
             f"{s['heads']} (deepest layer used {s['deepest_layer']} of {s['layers']}).", "",
             "| configuration | median s | pairs/s | time / (s) |", "|---|---:|---:|---:|"]
    for r in result["rows"]:
        lines.append(f"| {r['label']} | {r['median_s']:.2f} | {r['pairs_per_s']:.0f} | {r['ratio_to_shared']:.2f} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
