"""What a seed ensemble adds at inference: the base pass + 1 head against the base pass + an N-head ensemble.

    PYTHONPATH=src python benchmarks/ensemble_cost.py --config configs/cola.yaml --members 3,5 --rows 512

The serving path (adalayers.serve): every head's begin(), one base pass with the shared tap, every
head's end(). Heads are freshly initialised from the config (weights do not change the work) with
uniform layer weights, so every layer is projected: the most work a member can add. Each repeat
times every configuration once, in a rotating order (drift in a shared machine's load hits all
alike); a configuration's ratio is the median over repeats of its time / (base + 1 head)'s time in
the same repeat. The heads alone are also timed on hidden states computed once and replayed (the
work an ensemble adds, free of the base pass's noise), as a fraction of the base pass.
Writes <out>.json and <out>.md.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from adalayers import config  # noqa: E402
from adalayers.recipes import service
from adalayers.data.encoding import EncodedSplit, batches  # noqa: E402
from adalayers.model.ensemble import EnsembleTask  # noqa: E402
from adalayers.store.run import atomic_write, write_json  # noqa: E402
from adalayers.model.sidetask import SideTask, shared_tap  # noqa: E402


def heads(cfg, backbone, labels, n: int, seed0: int) -> list[SideTask]:
    out = []
    for s in range(seed0, seed0 + n):
        torch.manual_seed(s)
        out.append(SideTask(cfg, backbone.num_layers, backbone.hidden_size, labels).eval())
    return out


@torch.no_grad()
def seconds(backbone, tasks, part: EncodedSplit, batch_size: int, pad_id: int) -> float:
    t0 = time.perf_counter()
    for batch in batches(part, batch_size, pad_id):
        for t in tasks:
            t.begin()
        backbone(batch, taps=[shared_tap(tasks)] if tasks else [], stop_after=None)
        for t in tasks:
            t.end(batch["attention_mask"])
    return time.perf_counter() - t0


@torch.no_grad()
def states(backbone, part: EncodedSplit, batch_size: int, pad_id: int) -> list:
    """Every batch's hidden states, computed once: the heads-only timings replay them."""
    out = []
    for batch in batches(part, batch_size, pad_id):
        zs = []
        backbone(batch, taps=[lambda i, z: zs.append(z)], stop_after=None)
        out.append((zs, batch["attention_mask"]))
    return out


@torch.no_grad()
def head_seconds(tasks, replay: list) -> float:
    """The heads' own work on stored hidden states: begin, the shared tap of every layer, end."""
    t0 = time.perf_counter()
    for zs, mask in replay:
        for t in tasks:
            t.begin()
        tap = shared_tap(tasks)
        for i, z in enumerate(zs):
            tap(i, z)
        for t in tasks:
            t.end(mask)
    return time.perf_counter() - t0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="configs/cola.yaml")
    ap.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE")
    ap.add_argument("--members", default="3,5", help="ensemble sizes to time")
    ap.add_argument("--rows", type=int, default=512, help="validation rows per timing")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default="benchmarks/results/ensemble_cost")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    cfg = config.load(args.config, args.overrides + ["train.device=cpu"])
    backbone, data, encoded = service.prepare(cfg)
    split = encoded["validation"]
    part = EncodedSplit(split.name, split.rows[: args.rows], min(args.rows, split.num_examples))
    pad_id, bs = backbone.tokenizer.pad_token_id or 0, cfg.train.eval_batch_size
    sizes = [int(x) for x in args.members.split(",")]
    configs = {"base alone": [], "base + 1 head": heads(cfg, backbone, data.labels, 1, 0)}
    for n in sizes:
        configs[f"base + ensemble of {n}"] = [EnsembleTask(heads(cfg, backbone, data.labels, n, 0))]
    names = list(configs)
    seconds(backbone, configs[names[-1]], part, bs, pad_id)  # warm-up
    times = {n: [] for n in names}
    for r in range(args.repeats):
        order = names[r % len(names):] + names[: r % len(names)]
        for n in order:
            times[n].append(seconds(backbone, configs[n], part, bs, pad_id))
    replay = states(backbone, part, bs, pad_id)
    head_names = [n for n in names if configs[n]]
    head_times = {n: [] for n in head_names}
    for r in range(args.repeats):
        for n in head_names[r % len(head_names):] + head_names[: r % len(head_names)]:
            head_times[n].append(head_seconds(configs[n], replay))
    ref = "base + 1 head"
    rows = []
    for n in names:
        ratios = [t / b for t, b in zip(times[n], times[ref])]
        rows.append({"config": n, "median_seconds_per_1000": round(statistics.median(times[n]) / len(part.rows) * 1000, 3),
                     "ratio_to_one_head": round(statistics.median(ratios), 3),
                     "trainable_params": sum(t.num_trainable() for t in configs[n])})
        if n in head_times:
            rows[-1]["heads_only_seconds_per_1000"] = round(statistics.median(head_times[n]) / len(part.rows) * 1000, 3)
            rows[-1]["heads_only_over_base_pass"] = round(statistics.median(
                h / b for h, b in zip(head_times[n], times["base alone"])), 4)
    settings = {"config": args.config, "overrides": args.overrides, "base": cfg.model.base, "rows": len(part.rows),
                "max_length": cfg.model.max_length, "batch_size": bs, "repeats": args.repeats,
                "threads": args.threads, "torch": torch.__version__, "machine": platform.processor() or platform.machine(),
                "note": "shared 2-core machine; ratios from the same repeat"}
    write_json(Path(args.out + ".json"), {"settings": settings, "results": rows})
    md = [f"# Seed ensemble inference cost ({cfg.model.base}, {data.name} validation, {len(part.rows)} rows)", "",
          f"Settings: `{json.dumps(settings)}`", "",
          "| configuration | s per 1,000 rows (median) | time / (base + 1 head) | heads alone: s per 1,000 rows "
          "| heads alone / base pass | head parameters |", "|---|---:|---:|---:|---:|---:|"]
    md += [f"| {r['config']} | {r['median_seconds_per_1000']:.2f} | {r['ratio_to_one_head']:.3f} | "
           f"{r.get('heads_only_seconds_per_1000', 0):.3f} | {r.get('heads_only_over_base_pass', 0):.4f} | "
           f"{r['trainable_params']:,} |" for r in rows]
    atomic_write(Path(args.out + ".md"), "\n".join(md) + "\n")
    print("\n".join(md))
    return 0


if __name__ == "__main__":
    sys.exit(main())
