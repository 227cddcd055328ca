"""Several seeds of one config: N runs, every metric as median and min-max, and their ensemble.

`adalayers train CONFIG --seeds N --out DIR` trains DIR/seed_<s>/ for s = train.seed .. train.seed+N-1
(a finished seed with the same settings is reused, so an interrupted call resumes) and writes
DIR/metrics.json: the medians in the usual places (validation, test, train_seconds, ...) and, under
"spread", {median, min, max, values} of every number in the seeds' metrics. With --ensemble,
DIR/ensemble/ is a run folder of the seeds' ensemble (adalayers.model.ensemble), scored like a run.
"""
from __future__ import annotations

import functools
import statistics
from pathlib import Path

from adalayers import config as config_mod
from adalayers.store import run as runlib
from adalayers.errors import ConfigError, RunError
from adalayers.lab.runs import finished

SUMMED = ("train_seconds",)  # reported as the total over the seeds, besides the spread
SCALARS = ("train_seconds", "epochs", "best_epoch", "trainable_params", "base_params")


def seed_config(cfg, seed: int):
    return config_mod.from_dict(cfg.to_dict(), [f"train.seed={seed}"])


def numbers(d: dict, prefix: str = "") -> dict[str, float]:
    """Every number in a nested dict, keyed by its dotted path (per_class.LOC.f1)."""
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(numbers(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[f"{prefix}{k}"] = v
    return out


def spread(values: list[float]) -> dict:
    median = statistics.median(values)
    if all(isinstance(v, int) for v in values) and median == int(median):
        median = int(median)  # an even number of seeds: the mean of two equal counts stays a count (41,353, not 41,353.0)
    return {"median": median, "min": min(values), "max": max(values), "values": list(values)}


def aggregate(metrics: list[dict], seeds: list[int]) -> dict:
    """Per-seed metrics.json dicts -> one metrics.json: medians where one run has a value, plus the spread."""
    out: dict = {"seeds": list(seeds), "spread": {}}
    for split in ("validation", "test"):
        if not all(split in m for m in metrics):
            continue
        per_seed = [numbers(m[split]) for m in metrics]
        keys = [k for k in per_seed[0] if all(k in p for p in per_seed)]
        out["spread"][split] = {k: spread([p[k] for p in per_seed]) for k in keys}
        out[split] = {k: s["median"] for k, s in out["spread"][split].items() if "." not in k}
    for key in SCALARS:
        if all(key in m for m in metrics):
            out["spread"][key] = spread([m[key] for m in metrics])
            out[key] = out["spread"][key]["median"]
    out["train_seconds_total"] = round(sum(m.get("train_seconds", 0) for m in metrics), 2)
    weights = [m["layer_weights"] for m in metrics if m.get("layer_weights")]
    if len(weights) == len(metrics):
        out["layer_weights"] = [statistics.median(col) for col in zip(*weights)]
    return out


def train_seeds(cfg, out: Path, n: int, ensemble: bool = False) -> dict:
    from adalayers.recipes import service

    if n < 1:
        raise ConfigError(f"--seeds: must be at least 1, got {n}")
    if ensemble and n < 2:
        raise ConfigError("--ensemble: needs --seeds N with N >= 2")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    prepared = service.prepare(cfg)  # one base and one encoding for every seed (sets head.kind)
    if ensemble:  # an ensemble averages its members' heads: every seed keeps its head
        cfg = config_mod.from_dict(cfg.to_dict(), ["train.keep=head"])
    seeds = [cfg.train.seed + i for i in range(n)]
    dirs, metrics = [], []
    for s in seeds:
        cfg_s, run_dir = seed_config(cfg, s), out / f"seed_{s}"
        done = finished(run_dir, cfg_s)
        kept_by = done and done["meta"]["config"]["train"].get("keep", "head")
        if done is not None and kept_by != cfg_s.train.keep:
            raise RunError(f"{run_dir} was kept with train.keep={kept_by} and this call asks train.keep="
                           f"{cfg_s.train.keep} (--ensemble trains with train.keep=head): give a new --out, or the "
                           f"same --keep and --ensemble as before")
        if done is not None:
            print(f"[seeds] seed {s}: {run_dir} is finished, reusing it")
            m = done["metrics"]
        else:
            print(f"[seeds] seed {s} ({len(dirs) + 1} of {n}): training into {run_dir}")
            m = service.train(cfg_s, run_dir, prepared=prepared, overwrite=True)  # other settings: replaced
        dirs.append(run_dir)
        metrics.append(m)
    summary = aggregate(metrics, seeds)
    summary["runs"] = [d.name for d in dirs]
    summary["main_metric"] = prepared[1].main_metric
    if ensemble:
        summary["ensemble"] = build_ensemble(out / "ensemble", dirs, cfg, prepared)
    runlib.write_json(out / "metrics.json", summary)
    runlib.atomic_write(out / "seeds.md", table(summary))
    return summary


def build_ensemble(ens_dir: Path, member_dirs: list[Path], cfg, prepared) -> dict:
    """Write a run folder that loads as the members' ensemble, and score it on every split it has."""
    from adalayers.recipes import service
    from adalayers.recipes.evaluate import evaluate_split
    from adalayers.model.precision import autocast_for

    backbone, data, encoded = prepared
    ens_dir = Path(ens_dir)
    ens_dir.mkdir(parents=True, exist_ok=True)
    members = [runlib.read_config(d) for d in member_dirs]
    runlib.save_config(ens_dir, runlib.run_config(member_dirs[0], members[0]), members[0]["labels"], backbone,
                       ensemble=[f"../{d.name}" for d in member_dirs], task=data.name, kind=data.kind,
                       main_metric=data.main_metric)
    task, run_cfg, _ = runlib.load_head(ens_dir, backbone)
    task.to(backbone.device)
    source = service.make_source(run_cfg, backbone, data, encoded)
    result = {"members": [d.name for d in member_dirs], "trainable_params": task.num_trainable()}
    for split in ("validation", "test"):
        if split in encoded:
            result[split], _ = evaluate_split(task, source, encoded[split], data.splits[split],
                                              run_cfg.train.eval_batch_size, backbone.tokenizer.pad_token_id or 0,
                                              autocast_for(run_cfg.train.precision, backbone.device))
    runlib.write_json(ens_dir / "metrics.json", result)
    return result


def _f(v) -> str:
    return "" if v is None else f"{v:.4f}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v)


def table(summary: dict) -> str:
    """Markdown: one row per metric and split; median, min-max, every seed, and the ensemble."""
    seeds, ens = summary["seeds"], summary.get("ensemble")
    lines = [f"# {len(seeds)} seeds ({', '.join(map(str, seeds))})", "",
             "| split | metric | median | min – max | " + " | ".join(f"seed {s}" for s in seeds)
             + (" | ensemble |" if ens else " |"),
             "|---" * (4 + len(seeds) + (1 if ens else 0)) + "|"]
    for split in ("validation", "test"):
        for k, s in summary["spread"].get(split, {}).items():
            if "." in k or k == "n":
                continue
            row = [split, k, _f(s["median"]), f"{_f(s['min'])} – {_f(s['max'])}"] + [_f(v) for v in s["values"]]
            if ens:
                row.append(_f((ens.get(split) or {}).get(k)))
            lines.append("| " + " | ".join(row) + " |")
    lines += ["", f"Training time: {summary['train_seconds_total']:.0f} s over the {len(seeds)} seeds.", ""]
    return "\n".join(lines)


def cell(spread_entry: dict | None, fmt: str = "{:.4f}") -> str:
    """'0.2450 (0.2300–0.2510)': a median with its min-max, for the sweep and compare tables."""
    if not spread_entry:
        return ""
    m, lo, hi = (fmt.format(spread_entry[k]) for k in ("median", "min", "max"))
    return m if len(spread_entry["values"]) < 2 else f"{m} ({lo}–{hi})"


def add_commands(sub) -> None:
    """`adalayers train --seeds N [--ensemble]`: the lab's extension of the product's train command."""
    p = sub.choices["train"]
    p.add_argument("--seeds", type=int, metavar="N",
                   help="train N seeds (train.seed, train.seed+1, ...) into OUT/seed_<s>/ and report every metric "
                        "as median and min-max in OUT/metrics.json and OUT/seeds.md")
    p.add_argument("--ensemble", action="store_true",
                   help="with --seeds: also write OUT/ensemble/, a run folder averaging the seeds' probabilities "
                        "(values for regression) from one base pass, and score it")
    p.set_defaults(fn=functools.partial(cmd_train, p.get_default("fn")))


def cmd_train(train, args) -> int:
    """`train` with --seeds or --ensemble: the seeds' folders and their table; else the product's `train`."""
    if args.seeds is None and not args.ensemble:
        return train(args)
    from adalayers.data.tasks.shortcut import load_config

    if getattr(args, "select_layers", None) is not None:
        raise ConfigError("--select-layers: not with --seeds; select on one seed, then run the chosen layer's "
                          "config with --seeds")
    if args.ensemble and (args.seeds or 1) < 2:
        raise ConfigError("--ensemble: needs --seeds N with N >= 2")
    if args.resume:
        raise ConfigError("--resume: with --seeds, run the same command again (finished seeds are reused)")
    out = Path(args.out)
    summary = train_seeds(load_config(args), out, args.seeds or 1, ensemble=args.ensemble)
    print((out / "seeds.md").read_text(encoding="utf-8"))
    print(f"run folders: {', '.join(str(out / r) for r in summary['runs'])}"
          + (f"; ensemble: {out / 'ensemble'}" if args.ensemble else ""))
    return 0
