"""Issue 55's table: per cell, the trained head, the best linear probe and the model the run keeps (train.keep=best).

    python benchmarks/kept_table.py minilm-cola minilm-17 --out runs/kept            # 3 seeds each
    python benchmarks/kept_table.py minilm-banking77 --extra DIR --single-layer        # DIR: probe_tasks_data.py's

Each cell is one `adalayers train ... --seeds N --keep best` (a subprocess, as a user runs it, from the cache,
train.num_threads=--threads), reused when its OUT/CELL/seed_<s>/ are finished. From every seed's metrics.json:
the head's, the best probe's (its layer and pooling) and the kept model's validation and test main metric.
--single-layer also trains, for the cells that have no measured single-layer column, the head pinned to each
layer on seed 0 (mixer.pin_layer, train.keep=head), then the layer best on validation on the other seeds: the
best single-layer head and its lowest seed, which the kept model is compared with.

Writes benchmarks/results/kept_table.json (cells measured earlier and not rerun are kept) with every seed's
numbers, the medians, the commands and the machine, and prints the table as markdown.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

from adalayers.files import atomic_write

HERE = Path(__file__).resolve().parent
RESULT = HERE / "results" / "kept_table.json"
DATA = "$ADALAYERS_DATA"   # written into the commands as is: the data folder's place is the user's
EXTRA = "$EXTRA"           # probe_tasks_data.py's output folder (--extra)

GEMMA_SUBSETS = {
    "conll": ["--set", "task.max_train_examples=3000", "--set", "task.max_eval_examples=1000",
              "--set", "train.max_epochs=20"],
    "imdb": ["--set", "task.max_train_examples=1000", "--set", "task.max_eval_examples=500",
             "--set", "model.max_length=128"],
    "qqp": ["--set", "task.name=qqp", "--set", "task.max_train_examples=4000", "--set", "task.max_eval_examples=1000",
            "--set", "model.runtime=llama.cpp", "--set", "model.max_length=128"],
}


def files(task: str, pair: bool = False) -> list[str]:
    d = f"{EXTRA}/{task}"
    return (["--data", f"{d}/train.tsv", "--validation", f"{d}/dev.tsv", "--test", f"{d}/test.tsv", "--text", "text",
             "--label", "label"] + (["--text-pair", "text_pair"] if pair else []))


# name: (base, train arguments, has a measured single-layer column in docs/results.md)
CELLS: dict[str, tuple[str, list[str], bool]] = {
    "minilm-cola": ("minilm-l6", ["configs/cola.yaml"], True),
    "minilm-conll": ("minilm-l6", ["configs/conll.yaml"], True),
    "mpnet-cola": ("mpnet-base", ["configs/cola.yaml"], True),
    "mpnet-conll": ("mpnet-base", ["configs/conll.yaml"], True),
    "gemma-cola": ("gemma3-270m", ["configs/cola.yaml"], True),
    "gemma-conll": ("gemma3-270m", ["configs/conll.yaml", *GEMMA_SUBSETS["conll"]], True),
    "gemma-imdb": ("gemma3-270m", ["configs/imdb.yaml", *GEMMA_SUBSETS["imdb"]], True),
    # QQP's first 4,000 training / 1,000 evaluation pairs, each pair one text (issue 40's cell, docs/results.md)
    "gemma-qqp": ("gemma3-270m", ["configs/cola.yaml", *GEMMA_SUBSETS["qqp"]], True),
    # 17 classes: which publication a CoLA sentence is from; test: dev's rows from those 17 (cola17_test, at start)
    "minilm-17": ("minilm-l6", ["--data", f"{DATA}/glue/CoLA/train.tsv", "--text", "3", "--label", "0",
                                "--test", "OUT/cola17_test.tsv"], True),
    "minilm-banking77": ("minilm-l6", files("banking77"), False),
    "minilm-sick": ("minilm-l6", files("sick", pair=True), False),
    "gemma-banking77": ("gemma3-270m", files("banking77"), False),
    "gemma-sick": ("gemma3-270m", files("sick", pair=True), False),
}


# The metric a cell is reported in where it is not its task's main metric (README table), e.g. QQP's MCC; the runs
# still choose their best epoch and what they keep on the main metric, as the cell's earlier runs did.
REPORTED = {"gemma-qqp": "mcc"}


def cola17_test(data: Path, out: Path) -> None:
    """The 17-class task's test file: CoLA dev's rows whose source (first column) occurs in train.tsv."""
    seen = {line.split("\t", 1)[0] for line in (data / "glue/CoLA/train.tsv").read_text(encoding="utf-8").splitlines()}
    rows = [line for line in (data / "glue/CoLA/dev.tsv").read_text(encoding="utf-8").splitlines()
            if line.split("\t", 1)[0] in seen]
    atomic_write(out / "cola17_test.tsv", "".join(r + "\n" for r in rows))


def expand(args: list[str], env: dict[str, str], out: Path) -> list[str]:
    return [a.replace(DATA, env["ADALAYERS_DATA"]).replace(EXTRA, env.get("EXTRA", EXTRA))
            .replace("OUT/", f"{out}/") for a in args]


def train(name: str, run: Path, seeds: int, threads: int, env: dict, out: Path, extra: list[str],
          keep: str = "best") -> list[str]:
    base, args, _ = CELLS[name]
    shown = ["adalayers", "train", *args, "--seeds", str(seeds), "--keep", keep, "--out", f"OUT/{run.name}",
             "--set", f"model.base={base}", "--set", f"train.num_threads={threads}", "--set", "cache.enabled=true",
             *extra]
    cmd = [sys.executable, "-m", "adalayers", *expand(shown[1:], env, out)]
    cmd[cmd.index(f"{out}/{run.name}")] = str(run)
    run.mkdir(parents=True, exist_ok=True)
    with (run.parent / f"{run.name}.log").open("ab") as log:
        done = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)
    if done.returncode:
        raise SystemExit(f"[kept_table] {name}: `{shlex.join(cmd)}` failed ({done.returncode}); "
                         f"see {run.parent / f'{run.name}.log'}")
    return shown


def seed_rows(run: Path, seeds: int, metric: str | None = None) -> list[dict]:
    rows = []
    for s in range(seeds):
        m = json.loads((run / f"seed_{s}" / "metrics.json").read_text(encoding="utf-8"))
        main = metric or (m["main_metric"] if "main_metric" in m else json.loads(
            (run / f"seed_{s}" / "config.json").read_text(encoding="utf-8"))["main_metric"])
        probe = m.get("probe") or {}
        rows.append({"seed": s, "metric": main, "kept": m.get("kept", "head"),
                     "head": {k: m["head"][k][main] for k in ("validation", "test") if k in m.get("head", {})},
                     "probe": {"layer": probe.get("layer"), "pooling": probe.get("pooling"),
                               **{k: probe[k][main] for k in ("validation", "test") if k in probe}},
                     "kept_test": m["test"][main], "kept_validation": m["validation"][main]})
    return rows


def single_layer(name: str, out: Path, seeds: int, threads: int, env: dict) -> dict:
    """Seed 0 pinned to every layer (the cell's own runs say how many the base has); the layer best on
    validation over every seed."""
    num_layers = len(json.loads((out / name / "seed_0" / "metrics.json").read_text(encoding="utf-8"))["layer_weights"])
    first = {}
    for layer in range(num_layers):
        run = out / f"{name}_layer{layer}"
        train(name, run, 1, threads, env, out, ["--set", f"mixer.pin_layer={layer}"], keep="head")
        first[layer] = seed_rows(run, 1, REPORTED.get(name))[0]["head"]
    best = max(first, key=lambda i: first[i]["validation"])
    run = out / f"{name}_layer{best}_seeds"
    train(name, run, seeds, threads, env, out, ["--set", f"mixer.pin_layer={best}"], keep="head")
    tests = [r["head"]["test"] for r in seed_rows(run, seeds, REPORTED.get(name))]
    return {"layer": best, "seed0_by_layer": first, "test": tests, "median": statistics.median(tests), "min": min(tests)}


def summary(rows: list[dict]) -> dict:
    def med(xs):
        return statistics.median(xs)
    return {"head_test": med([r["head"]["test"] for r in rows]),
            "probe_test": med([r["probe"]["test"] for r in rows]),
            "kept_test": med([r["kept_test"] for r in rows]),
            "kept_min": min(r["kept_test"] for r in rows),
            "kept": [r["kept"] for r in rows],
            "probe_layers": [f"L{r['probe']['layer']} {r['probe']['pooling']}" for r in rows]}


def markdown(cells: dict) -> str:
    lines = ["| cell | metric | head | best probe | kept (which, per seed) | best single layer (lowest seed) |",
             "|---|---|---:|---:|---|---|"]
    for name, c in cells.items():
        s, single = c["summary"], c.get("single_layer")
        sl = f"{single['median']:.3f}, L{single['layer']} ({single['min']:.3f})" if single else "docs/results.md"
        lines.append(f"| {name} | {c['metric']} | {s['head_test']:.3f} | {s['probe_test']:.3f} "
                     f"({', '.join(sorted(set(s['probe_layers'])))}) | {s['kept_test']:.3f} ({', '.join(s['kept'])}) "
                     f"| {sl} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cells", nargs="+", choices=sorted(CELLS))
    ap.add_argument("--out", type=Path, default=Path("runs/kept"))
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2, help="train.num_threads of every run")
    ap.add_argument("--extra", type=Path, help="probe_tasks_data.py's output folder (banking77/, sick/)")
    ap.add_argument("--single-layer", action="store_true",
                    help="also the best single-layer head of the cells docs/results.md has no column for")
    args = ap.parse_args()
    env = dict(os.environ, HF_HUB_OFFLINE="1", ADALAYERS_DATA=os.environ.get("ADALAYERS_DATA",
                                                                              str(HERE.parent.parent / "shared/data")))
    if args.extra:
        env["EXTRA"] = str(args.extra.resolve())
    args.out.mkdir(parents=True, exist_ok=True)
    out = args.out.resolve()
    cola17_test(Path(env["ADALAYERS_DATA"]), out)
    result = json.loads(RESULT.read_text(encoding="utf-8")) if RESULT.exists() else {"cells": {}}
    for name in args.cells:
        if EXTRA in " ".join(CELLS[name][1]) and "EXTRA" not in env:
            ap.error(f"{name} reads probe_tasks_data.py's files: give --extra DIR")
        run = out / name
        command = train(name, run, args.seeds, args.threads, env, out, [])
        rows = seed_rows(run, args.seeds, REPORTED.get(name))
        cell = {"base": CELLS[name][0], "metric": rows[0]["metric"], "command": shlex.join(command),
                "seeds": rows, "summary": summary(rows)}
        if args.single_layer and not CELLS[name][2]:
            cell["single_layer"] = single_layer(name, out, args.seeds, args.threads, env)
        result["cells"][name] = cell
        result["machine"] = {"python": platform.python_version(), "cpus": os.cpu_count(), "platform": platform.platform()}
        result["settings"] = {"seeds": args.seeds, "threads": args.threads, "keep": "best",
                              "data": "$ADALAYERS_DATA; new tasks: benchmarks/probe_tasks_data.py (docs/data.md)"}
        atomic_write(RESULT, json.dumps(result, indent=1) + "\n")
        print(f"[kept_table] {name}: {json.dumps(cell['summary'])}", flush=True)
    print(markdown(result["cells"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
