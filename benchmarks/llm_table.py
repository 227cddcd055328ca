"""The README's decoder-vs-encoder table, from the results benchmarks/llm_tables.sh leaves.

    python benchmarks/llm_table.py --base gemma3-270m minilm-l6 mpnet-base minilm-l6_subset mpnet-base_subset

Reads benchmarks/results/sweep_<task>_<base>/sweep.json (AdaLayers and the single-layer runs of
`adalayers sweep-layers`) and benchmarks/results/probes_<task>_<base>.json (benchmarks/linear_probes.py)
for every task found (a name with a tag, e.g. minilm-l6_subset, reads what `TAG=_subset
benchmarks/llm_tables.sh` left), and writes benchmarks/results/llm_table.md: the test metric of AdaLayers, of the
single layer chosen on validation, of the last layer, and of the linear probes (layer chosen on
validation), with AdaLayers' trainable parameters, training time and the layers it weighs most. A sweep
trained with several seeds (SEEDS=N) shows medians with min–max (the training time: the median seed's).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from adalayers.lab.seeds import cell

RESULTS = Path(__file__).resolve().parent / "results"
TASKS = ("cola", "conll2003", "imdb")


def _n(x) -> str:
    return "–" if x is None else f"{x:.3f}"


def _metric(e: dict) -> str:
    """An entry's test metric; with seeds, their median (min–max)."""
    return cell((e.get("spread") or {}).get("test"), "{:.3f}") or _n(e["test_main"])


def row(task: str, base: str) -> str | None:
    sweep_file = RESULTS / f"sweep_{task}_{base}" / "sweep.json"
    if not sweep_file.is_file():
        return None
    s = json.loads(sweep_file.read_text())
    ada = s["adalayers"]
    by_layer = {e["pin_layer"]: e for e in s["layers"]}
    best, last = by_layer.get(s["best_layer"]), by_layer.get(s["last_layer"])
    probes_file = RESULTS / f"probes_{task}_{base}.json"
    p = json.loads(probes_file.read_text()) if probes_file.is_file() else None
    swept = ",".join(str(i) for i in sorted(by_layer))
    weights = ada["layer_weights"]
    top = sorted(range(len(weights)), key=lambda i: -weights[i])[:3]
    cells = [
        task, base, f"{s['metric']} (n={s['test_examples']:,}, train {s['train_examples']:,})",
        f"**{_metric(ada)}**",
        f"{_metric(best)} (layer {s['best_layer']} of {swept})" if best else "–",
        f"{_metric(last)} (layer {s['last_layer']})" if last else "–",
        f"{_n(p['best_mean']['test'])} (layer {p['best_mean']['layer']})" if p else "–",
        f"{_n(p['best_last']['test'])} (layer {p['best_last']['layer']})" if p else "–",
        _n(p["concat"]["test"]) if p else "–",
        f"{ada['trainable_params']:,} ({100 * ada['trainable_params'] / ada['base_params']:.2f}%)",
        f"{ada['train_seconds']:.0f} s",
        ", ".join(f"{i} ({weights[i]:.2f})" for i in top),
    ]
    return "| " + " | ".join(cells) + " |"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", nargs="+", default=["gemma3-270m", "minilm-l6", "mpnet-base"])
    args = ap.parse_args()
    lines = ["| task | base | test metric | AdaLayers | best single layer (on validation) | last layer | "
             "probe: mean-pooled, best layer | probe: last token, best layer | probe: all layers concatenated | "
             "AdaLayers trainable params (% of base) | AdaLayers training | layers weighed most (weight) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    rows = [r for t in TASKS for b in args.base if (r := row(t, b))]
    if not rows:
        raise SystemExit(f"llm_table: no sweep results for {args.base} in {RESULTS}")
    out = RESULTS / "llm_table.md"
    out.write_text("\n".join(lines + rows) + "\n")
    print(out.read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
