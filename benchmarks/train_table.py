"""Train configs on a base and write the results table the README quotes.

    python benchmarks/train_table.py configs/cola.yaml --base minilm-l6 --out runs/bench

For each config: trains (or reuses a finished run folder), then writes
benchmarks/results/<task>_<base>.json and rewrites benchmarks/results/table_<base>.md, the markdown
table of every task measured on that base: test metrics, trainable parameters as % of the base,
training time, epochs and the learned layer weights.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

import torch

from adalayers import config
from adalayers.recipes import service
from adalayers.store.run import write_json

HERE = Path(__file__).resolve().parent


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("configs", nargs="+")
    ap.add_argument("--base", default="minilm-l6")
    ap.add_argument("--out", default="runs/bench", help="where run folders go")
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--retrain", action="store_true", help="train even if the run folder has metrics.json")
    args = ap.parse_args()
    rows = []
    for path in args.configs:
        cfg = config.load(path, [f"model.base={args.base}", *args.overrides])
        run = Path(args.out) / f"{cfg.task.name}_{args.base}"
        settings = {"config": path, "base": args.base, "overrides": args.overrides,
                    "max_length": cfg.model.max_length, "batch_size": cfg.train.batch_size,
                    "max_epochs": cfg.train.max_epochs, "max_train_examples": cfg.task.max_train_examples,
                    "max_eval_examples": cfg.task.max_eval_examples,
                    "device": "cuda " + torch.cuda.get_device_name() if torch.cuda.is_available() else
                    f"cpu ({cfg.train.num_threads or torch.get_num_threads()} threads, "
                    f"{platform.processor() or platform.machine()})"}
        print("settings:", json.dumps(settings), flush=True)
        if args.retrain or not (run / "metrics.json").is_file():
            service.train(cfg, run, overwrite=True)  # --retrain replaces a finished run
        m = json.loads((run / "metrics.json").read_text())
        result = {"settings": settings, "run": str(run), "test": m.get("test"), "validation": m.get("validation"),
                  "trainable_params": m["trainable_params"], "base_params": m["base_params"],
                  "trainable_pct": 100 * m["trainable_params"] / m["base_params"],
                  "train_seconds": m["train_seconds"], "best_epoch": m["best_epoch"], "epochs": m["epochs"],
                  "layer_weights": m["layer_weights"]}
        write_json(HERE / "results" / f"{cfg.task.name}_{args.base}.json", result)
    # The table lists every task measured on this base so far, not only this call's configs.
    for f in sorted((HERE / "results").glob(f"*_{args.base}.json")):
        rows.append((f.name[: -len(f"_{args.base}.json")], json.loads(f.read_text())))
    lines = ["| task | base | test metrics | trainable params (% of base) | train time | epochs (best) | layer weights |",
             "|---|---|---|---|---|---|---|"]
    for task, r in rows:
        t = r["test"] or {}
        shown = ", ".join(f"{k} {v:.3f}" for k, v in t.items() if isinstance(v, float))
        weights = " ".join(f"{w:.2f}" for w in r["layer_weights"])
        lines.append(f"| {task} | {args.base} | {shown} | {r['trainable_params']:,} ({r['trainable_pct']:.2f}%) | "
                     f"{r['train_seconds']:.0f} s | {r['epochs']} ({r['best_epoch']}) | {weights} |")
    table = "\n".join(lines)
    print(table)
    (HERE / "results").mkdir(exist_ok=True)
    (HERE / "results" / f"table_{args.base}.md").write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
