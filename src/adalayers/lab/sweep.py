"""`adalayers sweep-layers CONFIG --out DIR`: the single-layer baselines next to AdaLayers.

The same config is trained with mixer.pin_layer = each layer in turn (DIR/layer_<i>/) and once
unpinned (DIR/adalayers/, or an existing run given with --adalayers). A layer whose run folder
already holds metrics.json is read, not retrained, so an interrupted sweep resumes. Writes
DIR/sweep.json, DIR/sweep.md (a table) and DIR/sweep.png (test metric per layer as bars, the
AdaLayers result as a horizontal line).
"""
from __future__ import annotations

import json
from pathlib import Path

from adalayers import config as config_mod
from adalayers.store import run as runlib
from adalayers.errors import ConfigError, RunError
from adalayers.lab.figures import layer_names, pyplot, save_figure
from adalayers.lab.runs import differences, duration, finished, parameters_used, read_metrics
from adalayers.lab.seeds import cell

def _train_or_reuse(cfg, run_dir: Path, label: str, prepared_data) -> dict:
    """A finished run with these settings is reused (an interrupted sweep resumes); else train it."""
    done = finished(run_dir, cfg)
    if done is not None:
        print(f"[sweep] {label}: {run_dir} is finished, reusing it")
        return done
    print(f"[sweep] {label}: training into {run_dir}")
    from adalayers.recipes import service

    service.train(cfg, run_dir, prepared=prepared_data(), overwrite=True)  # other settings: replaced
    return finished(run_dir, cfg)


def _train_seeds(cfg, run_dir: Path, label: str, prepared_data, n: int) -> dict:
    """n seeds of one sweep entry in run_dir/seed_<s>/: their medians, with the spread (adalayers.lab.seeds)."""
    if n == 1:
        return _train_or_reuse(cfg, run_dir, label, prepared_data)
    from adalayers.lab import seeds

    done = [_train_or_reuse(seeds.seed_config(cfg, s), run_dir / f"seed_{s}", f"{label}, seed {s}", prepared_data)
            for s in range(cfg.train.seed, cfg.train.seed + n)]
    metrics = seeds.aggregate([d["metrics"] for d in done], list(range(cfg.train.seed, cfg.train.seed + n)))
    return {"metrics": metrics, "meta": done[0]["meta"]}


def parse_layers(text: str | None, num_layers: int) -> list[int]:
    if not text:
        return list(range(num_layers))
    try:
        layers = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--layers: expected comma-separated layer numbers such as 0,3,6, got {text!r}") from None
    bad = [i for i in layers if not 0 <= i < num_layers]
    if bad or not layers:
        raise ConfigError(f"--layers: the base has layers 0..{num_layers - 1}, got {text!r}")
    return sorted(set(layers))


def _entry(name: str, run_dir: Path, done: dict, main: str) -> dict:
    m, meta = done["metrics"], done["meta"]
    test, val = m.get("test") or {}, m.get("validation") or {}
    return {"name": name, "run": str(run_dir), "pin_layer": meta["config"]["mixer"]["pin_layer"],
            "test": {k: v for k, v in test.items() if not isinstance(v, (dict, list))},
            "validation": {k: v for k, v in val.items() if not isinstance(v, (dict, list))},
            "test_main": test.get(main), "validation_main": val.get(main),
            "best_epoch": m.get("best_epoch"), "epochs": m.get("epochs"), "train_seconds": m.get("train_seconds"),
            "trainable_params": m.get("trainable_params"), "params_used": parameters_used(m, meta),
            "base_params": m.get("base_params"), "layer_weights": m.get("layer_weights"),
            "used_layers": [i for i, w in enumerate(m.get("layer_weights") or []) if w > 0],
            "spread": {split: m["spread"][split].get(main) for split in ("validation", "test")
                       if split in m.get("spread", {})}}


def _given_adalayers(ada_dir: Path, ada_cfg) -> dict:
    """An AdaLayers run given with --adalayers (a run folder or a `train --seeds` folder), checked against the
    sweep's config: another dataset or base is refused, other settings are warned about."""
    ada_metrics = read_metrics(ada_dir)
    if not ada_metrics:
        raise RunError(f"--adalayers {ada_dir}: no metrics.json (is the run finished?)")
    # a folder of `train --seeds N` holds the seeds' summary; their settings are in its first seed's folder
    seeds_of = ada_metrics.get("runs") if not (ada_dir / "config.json").is_file() else None
    meta = runlib.read_config(ada_dir / seeds_of[0] if seeds_of else ada_dir)
    for d in [ada_dir / r for r in seeds_of] if seeds_of else [ada_dir]:
        if read_metrics(d).get("kept", "head") != "head":
            raise RunError(f"--adalayers {ada_dir}: {d} kept its linear probe (train.keep, selection.md), not the "
                           f"head the sweep compares; its head is in {d / 'candidates' / 'head'}, or train it "
                           f"with --keep head")
    diffs = differences(meta["config"], ada_cfg.to_dict())
    data_diffs = [d for d in diffs if d.startswith(("task.", "model."))]
    if data_diffs:  # another dataset, subset, base or max_length: nothing to compare
        raise RunError(f"--adalayers {ada_dir}: not comparable with the sweep ({'; '.join(data_diffs)})")
    for d in diffs:
        print(f"[sweep] warning: the AdaLayers run {ada_dir} differs from the sweep's config: {d}")
    return {"metrics": ada_metrics, "meta": meta, "differences": diffs}


def run_sweep(cfg, out: Path, layers: str | None = None, adalayers_run: Path | None = None, seeds: int = 1,
              table: bool = True) -> dict:
    """Every layer (and AdaLayers) trained `seeds` times: the table shows medians with min-max.

    table=False trains only the pinned layers and writes nothing else, so that a sweep can be split over
    processes or machines (--layers 0,4,8 --no-table, ...); a last call over every layer reuses their runs,
    trains or reads AdaLayers and writes the table."""
    from adalayers.recipes import service
    from adalayers.data.tasks import load_task
    from adalayers.core import pick_device

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = config_mod.from_dict(cfg.to_dict(), ["train.keep=head"])  # a sweep compares heads (probes: reported)
    backbone = service.load_base(cfg, pick_device(cfg.train.device))  # on the runtime of model.runtime
    data = load_task(cfg)
    num_layers, main = backbone.num_layers, data.main_metric
    wanted = parse_layers(layers, num_layers)
    prepared = None

    def prepared_data():  # the base and the encoded splits, shared by every run; built only if one trains
        nonlocal prepared
        if prepared is None:
            prepared = service.prepare(cfg, backbone)
        return prepared

    entries = []
    for i in wanted:
        cfg_i = config_mod.from_dict(cfg.to_dict(), [f"mixer.pin_layer={i}"])
        run_dir = out / f"layer_{i}"
        done = _train_seeds(cfg_i, run_dir, f"layer {i} of 0..{num_layers - 1}", prepared_data, seeds)
        entries.append(_entry(f"layer {i}", run_dir, done, main))
    if not table:
        return {"task": data.name, "base": cfg.model.base, "metric": main, "layers": entries}

    ada_cfg = config_mod.from_dict(cfg.to_dict(), ["mixer.pin_layer=null"])
    if adalayers_run is not None:
        ada_dir = Path(adalayers_run)
        ada = _given_adalayers(ada_dir, ada_cfg)
    else:
        ada_dir = out / "adalayers"
        ada = _train_seeds(ada_cfg, ada_dir, "AdaLayers (all layers)", prepared_data, seeds)
    ada_entry = _entry("AdaLayers", ada_dir, ada, main)
    ada_entry["differences"] = ada.get("differences", [])

    # the best single layer is chosen on validation, as a user without the test labels would;
    # the layer that happens to score best on test is recorded too, as an upper bound
    chosen = [e for e in entries if e["validation_main"] is not None]
    best = max(chosen, key=lambda e: (e["validation_main"], -e["pin_layer"])) if chosen else None
    scored = [e for e in entries if e["test_main"] is not None]
    best_test = max(scored, key=lambda e: (e["test_main"], -e["pin_layer"])) if scored else None
    last = next((e for e in entries if e["pin_layer"] == num_layers - 1), None)
    result = {"task": data.name, "base": cfg.model.base, "metric": main, "num_layers": num_layers,
              "max_length": cfg.model.max_length, "train_examples": len(data.splits["train"]),
              "test_examples": len(data.splits.get("test", [])), "seeds": seeds,
              "layers": entries, "adalayers": ada_entry,
              "best_layer": best["pin_layer"] if best else None,
              "best_layer_on_test": best_test["pin_layer"] if best_test else None,
              "last_layer": num_layers - 1 if last else None}
    from adalayers.engine import distributed

    if distributed.is_main():  # under torchrun: every rank trained, rank 0 writes
        runlib.write_json(out / "sweep.json", result)
        runlib.atomic_write(out / "sweep.md", _table(result))
        plot_sweep(result, out / "sweep.png")
    distributed.barrier()
    return result


def _table(r: dict) -> str:
    main = r["metric"]
    extra = [k for k in ("accuracy", "mcc", "precision", "recall") if k != main
             and any(k in e["test"] for e in r["layers"] + [r["adalayers"]])]

    def row(e, label):
        spread = e.get("spread") or {}
        cells = [label, cell(spread.get("validation")) or _f(e["validation_main"]),
                 cell(spread.get("test")) or _f(e["test_main"])] + [_f(e["test"].get(k)) for k in extra]
        cells += [f"{e['best_epoch']} / {e['epochs']}",
                  duration(e["train_seconds"]) if e["train_seconds"] is not None else "",
                  f"{e['params_used']:,}" if e["params_used"] is not None else ""]
        return "| " + " | ".join(cells) + " |"

    swept = [e["pin_layer"] for e in r["layers"]]
    if len(swept) == r["num_layers"]:
        partial = ""
    elif len(swept) == 1:
        partial = f" Only layer {swept[0]} was swept (--layers): it stands for the best single layer."
    else:
        partial = (f" Only layers {', '.join(map(str, swept))} were swept (--layers): the best single layer is the "
                   f"best of these.")
    lines = [f"# Single-layer sweep: {r['task']} on {r['base']}", "",
             f"The same head trained on one layer of the frozen base at a time (layer 0 = embedding output), "
             f"next to AdaLayers, which learns a weighting of all {r['num_layers']} layers. "
             f"max_length {r['max_length']}, {r['train_examples']:,} training examples, "
             f"{r['test_examples']:,} test examples. Params = trainable parameters the head uses." + partial
             + (f" Every run trained with {r['seeds']} seeds: medians, min–max in brackets (other columns: "
                f"medians)." if r.get("seeds", 1) > 1 else ""), "",
             f"| run | validation {main} | test {main} | " + " | ".join(f"test {k}" for k in extra)
             + (" | " if extra else "") + "best epoch / epochs | training time | params |",
             "|---" * (6 + len(extra)) + "|"]
    best = r["best_layer"]
    for e in r["layers"]:
        mark = " (best on validation)" if e["pin_layer"] == best else ""
        lines.append(row(e, f"layer {e['pin_layer']}{mark}"))
    a = r["adalayers"]
    lines.append(row(a, f"**AdaLayers** (layers {', '.join(map(str, a['used_layers']))})"))
    if a.get("differences"):
        lines += ["", "The AdaLayers run was trained separately, with these settings different from the "
                  "single-layer runs: " + "; ".join(a["differences"]) + "."]
    lines += ["", f"Test {main}: AdaLayers {_f(a['test_main'])}"]
    if best is not None:
        b = next(e for e in r["layers"] if e["pin_layer"] == best)
        lines[-1] += f"; best single layer (chosen on validation) {best}: {_f(b['test_main'])}"
        t = next(e for e in r["layers"] if e["pin_layer"] == r["best_layer_on_test"])
        if t["test_main"] > b["test_main"]:
            lines[-1] += f" (layer {t['pin_layer']} scores highest on test: {_f(t['test_main'])})"
    if r["last_layer"] is not None:
        l = next(e for e in r["layers"] if e["pin_layer"] == r["last_layer"])
        lines[-1] += f"; last layer {r['last_layer']}: {_f(l['test_main'])}"
    lines += ["", "![test metric per layer](sweep.png)", ""]
    return "\n".join(lines)


def _f(v) -> str:
    return "" if v is None else f"{v:.4f}"


def plot_sweep(r: dict, path: Path) -> None:
    plt = pyplot()
    main, entries, ada = r["metric"], [e for e in r["layers"] if e["test_main"] is not None], r["adalayers"]
    xs = [e["pin_layer"] for e in entries]
    vals = [e["test_main"] for e in entries]
    fig, ax = plt.subplots(figsize=(max(5.5, 0.55 * r["num_layers"] + 2.5), 4))
    colors = ["tab:orange" if x == r["best_layer"] else "tab:blue" for x in xs]
    bars = ax.bar(xs, vals, color=colors, label="head on one layer only (orange: best on validation)")
    for b, v in zip(bars, vals):
        ax.annotate(f"{v:.3f}", (b.get_x() + b.get_width() / 2, v), ha="center", va="bottom", fontsize=8)
    everything = vals + ([ada["test_main"]] if ada["test_main"] is not None else [])
    if ada["test_main"] is not None:
        ax.axhline(ada["test_main"], color="tab:red", ls="--",
                   label=f"AdaLayers, all layers weighted ({ada['test_main']:.3f})")
    lo, hi = min(everything), max(everything)
    pad = max(0.02, 0.25 * (hi - lo))
    bottom = max(0.0, lo - pad) if lo >= 0 else lo - pad
    ax.set_ylim(bottom, hi + pad)
    names = layer_names(r["num_layers"])
    ax.set_xticks(range(r["num_layers"]), names)
    ax.set_xlabel("layer of the base read by the head (0 = embedding output)")
    ax.set_ylabel(f"test {main}" + (" (axis starts above 0)" if bottom > 0 else ""))
    ax.set_title(f"{r['task']} on {r['base']}: single layers vs AdaLayers")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=8, frameon=False)
    ax.grid(axis="y", alpha=0.3)
    save_figure(fig, path)


def add_commands(sub) -> None:
    p = sub.add_parser("sweep-layers", help="train the head on each single layer and compare with AdaLayers")
    p.add_argument("config", help="YAML config file (see configs/)")
    p.add_argument("--out", required=True, help="sweep folder (layer_<i>/, adalayers/, sweep.json/.md/.png)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
                   help="override one config field (repeatable)")
    p.add_argument("--layers", help="comma-separated layers to sweep, e.g. 0,3,6 (default: all)")
    p.add_argument("--adalayers", metavar="RUN_DIR",
                   help="reuse this finished AdaLayers run (or `train --seeds N` folder) instead of training one")
    p.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="train every layer (and AdaLayers) with N seeds; tables show medians and min-max")
    p.add_argument("--no-table", action="store_true",
                   help="train only the --layers runs (no AdaLayers, no table): one part of a sweep split over "
                        "processes or machines; a last sweep-layers over every layer reuses them and writes the table")
    p.set_defaults(fn=_cmd_sweep, torchrun=True)


def _cmd_sweep(args) -> int:
    if args.no_table and args.adalayers:
        raise ConfigError("--adalayers: a --no-table part trains no AdaLayers run and writes no table; give "
                          "--adalayers to the last sweep-layers call, the one over every layer")
    cfg = config_mod.load(args.config, args.overrides)
    if args.seeds < 1:
        raise ConfigError(f"--seeds: must be at least 1, got {args.seeds}")
    r = run_sweep(cfg, Path(args.out), args.layers, Path(args.adalayers) if args.adalayers else None, args.seeds,
                  table=not args.no_table)
    from adalayers.engine import distributed

    if not distributed.is_main():
        return 0
    if args.no_table:
        done = ", ".join(f"{e['name']}: validation {_f(e['validation_main'])}" for e in r["layers"])
        print(f"[sweep] trained {done}; sweep-layers over every layer writes the table")
        return 0
    print(Path(args.out, "sweep.md").read_text(encoding="utf-8"))
    print(json.dumps({"best_layer": r["best_layer"], "adalayers": r["adalayers"]["test_main"]}))
    return 0
