"""Test MCC of CoLA heads on GLUE CoLA dev split by domain: sentences from the sources that the training
set also draws on (in-domain) and from sources it never saw (out-of-domain).

    python benchmarks/cola_domains.py --base mpnet-base --out benchmarks/results/cola_domains_mpnet \
        adalayers=runs/tuned_cola_mpnet/thesis/seed_0 adalayers=runs/tuned_cola_mpnet/thesis/seed_1 \
        layer6=runs/tuned_cola_mpnet/sweep/layer_6/seed_0 ...

Each argument is GROUP=RUN_DIR; a group's rows are its runs' medians. Every head answers from one base
pass (SideTasks). The validation split is carved out of train, so it is in-domain only; GLUE dev is half
out-of-domain. The whole-dev MCC of each run is checked against its metrics.json, so the split scores
come from the same predictions that the run reported. Writes OUT.json and OUT.md.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

from sklearn.metrics import matthews_corrcoef

from adalayers import config
from adalayers.serve import SideTasks
from adalayers.data.tasks import load_task, read_lines


def sources(path: Path) -> list[str]:
    """The first column (the sentence's source publication) of each non-blank line of a CoLA TSV."""
    return [line.split("\t")[0] for line in read_lines(path) if line.strip()]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", metavar="GROUP=RUN_DIR")
    ap.add_argument("--base", default="minilm-l6")
    ap.add_argument("--data", default=os.environ.get("ADALAYERS_DATA", "../shared/data"))
    ap.add_argument("--out", required=True, help="OUT.json and OUT.md are written")
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args(argv)

    pairs = [r.split("=", 1) for r in args.runs]
    if any(len(p) != 2 or not p[0] or not p[1] for p in pairs):
        sys.exit("error: give each run as GROUP=RUN_DIR")
    glue = Path(args.data) / "glue" / "CoLA"
    dev = load_task(config.from_dict({"task": {"name": "cola", "data_dir": args.data}})).splits["test"]  # GLUE dev
    dev_sources = sources(glue / "dev.tsv")
    if len(dev_sources) != len(dev):
        sys.exit(f"error: {glue / 'dev.tsv'}: {len(dev_sources)} lines but {len(dev)} test sentences")
    train_sources = set(sources(glue / "train.tsv"))
    labels = [int(e.label == "acceptable") for e in dev]
    in_domain = [s in train_sources for s in dev_sources]
    names = [f"{g}#{i}" for i, (g, _) in enumerate(pairs)]
    tasks = SideTasks.load(args.base, [f"{n}={run}" for n, (_, run) in zip(names, pairs)])
    predicted = {n: [] for n in names}
    texts = [e.text for e in dev]
    for at in range(0, len(texts), args.batch):
        for r in tasks.predict(texts[at:at + args.batch], tasks=names):
            for n in names:
                predicted[n].append(int(r["tasks"][n]["label"] == "acceptable"))

    def mcc(pred, keep):
        return float(matthews_corrcoef([y for y, k in zip(labels, keep) if k], [p for p, k in zip(pred, keep) if k]))

    runs = []
    for n, (group, run) in zip(names, pairs):
        reported = json.loads((Path(run) / "metrics.json").read_text())["test"]["mcc"]
        every = mcc(predicted[n], [True] * len(dev))
        if abs(every - reported) > 1e-6:
            sys.exit(f"error: {run}: MCC {every:.6f} on GLUE dev here, {reported:.6f} in its metrics.json")
        runs.append({"group": group, "run": run, "all": every, "in_domain": mcc(predicted[n], in_domain),
                     "out_of_domain": mcc(predicted[n], [not k for k in in_domain])})
    groups = {}
    for r in runs:
        groups.setdefault(r["group"], []).append(r)
    rows = {g: {k: statistics.median(r[k] for r in rs) for k in ("all", "in_domain", "out_of_domain")} | {"runs": len(rs)}
            for g, rs in groups.items()}
    n_in = sum(in_domain)
    result = {"base": args.base, "dev_rows": len(dev), "in_domain_rows": n_in, "out_of_domain_rows": len(dev) - n_in,
              "groups": rows, "runs": runs}
    lines = [f"# CoLA test MCC by domain ({args.base})", "",
             f"GLUE CoLA dev: {n_in} sentences from sources the training set draws on, {len(dev) - n_in} from "
             "sources it never saw. Medians over each group's runs.", "",
             "| group | runs | all | in-domain | out-of-domain |", "|---|---:|---:|---:|---:|"]
    lines += [f"| {g} | {r['runs']} | {r['all']:.4f} | {r['in_domain']:.4f} | {r['out_of_domain']:.4f} |"
              for g, r in rows.items()]
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out + ".json").write_text(json.dumps(result, indent=2) + "\n")
    Path(args.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
