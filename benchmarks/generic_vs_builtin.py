"""Built-in readers vs the same data given to task 'files': same seed, same settings -> same metrics?

For each dataset the built-in reader (cola, stsb, conll2003 when registered) and task 'files' pointed
at the same files train a head with identical settings; the script prints and saves both metric sets
and whether the examples and the numbers are identical.

    PYTHONPATH=src python benchmarks/generic_vs_builtin.py --train-examples 300 --eval-examples 150 --epochs 2
writes benchmarks/results/generic_vs_builtin.json and .md.
"""
from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import torch

from adalayers import config
from adalayers.recipes import service
from adalayers.store import run
from adalayers.data.tasks import TASKS, load_task

GENERIC = {
    "cola": lambda d: {"train": f"{d}/glue/CoLA/train.tsv", "test": f"{d}/glue/CoLA/dev.tsv", "text": 3, "label": 1,
                       "label_names": {0: "unacceptable", 1: "acceptable"}, "metric": "mcc"},
    "stsb": lambda d: {"train": f"{d}/glue/STS-B/train.tsv", "test": f"{d}/glue/STS-B/dev.tsv",
                       "text": "sentence1", "text_pair": "sentence2", "label": "score"},
    "conll2003": lambda d: {"train": f"{d}/conll2003/eng.train", "validation": f"{d}/conll2003/eng.testa",
                            "test": f"{d}/conll2003/eng.testb", "tag_scheme": "iob1"},
}
CONFIGS = {"cola": "configs/cola.yaml", "stsb": "configs/stsb.yaml", "conll2003": "configs/conll.yaml"}
MAIN = {"cola": "mcc", "stsb": "pearson", "conll2003": "f1"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", default=["cola", "stsb", "conll2003"])
    ap.add_argument("--train-examples", type=int, default=300)
    ap.add_argument("--eval-examples", type=int, default=150)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lr", type=float, default=None, help="default: the config's (1e-4)")
    ap.add_argument("--out", default="benchmarks/results/generic_vs_builtin")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True, warn_only=True)
    from adalayers.data.tasks import files, glue  # noqa: F401  (register their tasks)
    try:
        from adalayers.data.tasks import conll  # noqa: F401  (the built-in CoNLL-2003 reader, where present)
    except ImportError:
        pass
    data_dir = str(config.Config().data_dir().resolve())
    settings = {"train_examples": args.train_examples, "eval_examples": args.eval_examples, "epochs": args.epochs,
                "lr": args.lr or "config", "threads": args.threads, "data_dir": data_dir, "base": "minilm-l6 (configs)"}
    print("settings:", json.dumps(settings))
    results = []
    for name in args.tasks:
        if name not in TASKS or not Path(CONFIGS[name]).is_file():
            print(f"{name}: skipped (no built-in reader or config on this branch)")
            continue
        base = config.load(CONFIGS[name]).to_dict()
        base["train"].update(max_epochs=args.epochs, num_threads=args.threads)
        if args.lr:
            base["train"]["lr"] = args.lr
        base["cache"]["enabled"] = False
        limits = {"max_train_examples": args.train_examples, "max_eval_examples": args.eval_examples}
        builtin = config.from_dict({**base, "task": {**base["task"], **limits}})
        generic_task = {"name": "files", "data_dir": base["task"]["data_dir"], **GENERIC[name](data_dir), **limits}
        generic = config.from_dict({**base, "task": generic_task, "head": {**base["head"], "kind": None}})
        a, b = load_task(builtin), load_task(generic)
        same_examples = a.labels == b.labels and all(
            [vars(e) for e in a.splits[s]] == [vars(e) for e in b.splits.get(s, [])] for s in a.splits)
        row = {"task": name, "same_examples": same_examples, "main_metric": MAIN[name]}
        with tempfile.TemporaryDirectory() as tmp:
            for label, cfg in (("builtin", builtin), ("generic", generic)):
                print(f"--- {name}: {label}")
                m = service.train(cfg, Path(tmp) / label)
                row[label] = {split: {k: v for k, v in m[split].items() if not isinstance(v, dict)}
                              for split in ("validation", "test") if split in m}
        row["identical_metrics"] = row["builtin"] == row["generic"]
        results.append(row)
        print(f"{name}: same examples {same_examples}, identical metrics {row['identical_metrics']}")
    out = Path(args.out)
    run.write_json(out.with_suffix(".json"), {"settings": settings, "results": results})
    lines = [f"Settings: {json.dumps(settings)}", "",
             "| task | metric | built-in val | files val | built-in test | files test | same examples | identical |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        m = r["main_metric"]
        lines.append(f"| {r['task']} | {m} | {r['builtin']['validation'][m]:.4f} | {r['generic']['validation'][m]:.4f} "
                     f"| {r['builtin']['test'][m]:.4f} | {r['generic']['test'][m]:.4f} | {r['same_examples']} "
                     f"| {r['identical_metrics']} |")
    run.atomic_write(out.with_suffix(".md"), "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
