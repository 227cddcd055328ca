"""`adalayers compare-multitask CONFIG --out DIR`: the multi-task recipes side by side, and AdaLayers.

Variants (each one change against the baseline, so each number says what that change does):
  baseline      independent heads (no depends_on), shared base fine-tuned, the config's schedule
  progressive   + the config's depends_on graph (upstream heads frozen per freeze_upstream)
  pcgrad        + gradient surgery on the shared base
  smart         + SMART (smoothness + Bregman proximal term)
  freeze-top3   + all but the last 3 layers frozen
  adalayers     frozen base, one mixer + head per task (adalayers.recipes.service.train, hidden-state cache,
                early stopping), trained separately: independent heads that cannot hurt each other.
                Pair tasks read the cross-encoder input.
  adalayers-progressive
                adalayers + the config's depends_on graph: a head also reads its upstream heads'
                outputs (multitask/adalayers.py)
Resumable per variant: each finished variant is written to DIR/variants/<name>.json (atomically) and a
later run with the same settings skips it; AdaLayers heads also keep finished tasks (DIR/<variant>/<task>).
Before training, a few measured steps of every variant still to run give a time estimate.
Writes compare_multitask.json, compare_multitask.md and compare_multitask.png into DIR.
"""
from __future__ import annotations

import copy
import json
import logging
import shlex
from pathlib import Path

import torch

from adalayers.store import run as runlib
from adalayers.core import pick_device
from adalayers.errors import ConfigError
from adalayers.lab.multitask.adalayers import HEAD_LR
from adalayers.lab.multitask.config import stored as config_stored

log = logging.getLogger(__name__)

VARIANTS = ("baseline", "progressive", "pcgrad", "smart", "freeze-top3", "adalayers", "adalayers-progressive")
FROZEN = ("adalayers", "adalayers-progressive")  # frozen base: cheap once the hidden-state cache is built
RESULTS = "variants"  # out/variants/<name>.json: one finished variant each, written atomically
ESTIMATES = "estimate.json"  # out/estimate.json: the start-up estimate of each variant, in seconds


def variant_config(mcfg, name: str):
    v = copy.deepcopy(mcfg)
    v.freeze, v.pcgrad, v.smart.enabled = "none", False, False
    if name != "progressive":
        for t in v.tasks:
            t.depends_on = []
    if name == "pcgrad":
        v.pcgrad = True
    elif name == "smart":
        v.smart.enabled = True
    elif name == "freeze-top3":
        v.freeze = "top:3"
    return v


def settings(mcfg, adalayers_epochs: int, patience: int, lr: float = HEAD_LR) -> dict:
    """What a finished variant's result depends on; a result with other settings is not reused.

    Results stored before the AdaLayers learning rate could be set were run at the default.
    """
    return {"config": mcfg.to_dict(), "adalayers_max_epochs": adalayers_epochs, "adalayers_early_stopping": patience,
            "adalayers_lr": lr}


def finished(out: Path, name: str, want: dict) -> dict | None:
    """The stored row of a finished variant, or None; a row of other settings raises ConfigError.

    Settings added to the code after the row was stored do not count (adalayers.same_settings).
    """
    from adalayers.lab.multitask import adalayers

    path = out / RESULTS / f"{name}.json"
    if not path.is_file():
        return None
    try:
        row = json.loads(path.read_text(encoding="utf-8"))
        stored = row.pop("settings")
        stored.setdefault("adalayers_lr", HEAD_LR)  # stored before it could be set
        stored["config"] = config_stored(stored["config"])
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, AttributeError) as e:
        raise ConfigError(f"{path}: not a result of compare-multitask ({e}); remove it to run {name} again") from None
    if not adalayers.same_settings(stored, want):
        raise ConfigError(f"{path} was run with other settings than this command's; use another --out, or remove "
                          f"{out / RESULTS} to start over")
    return row


def print_estimate(mcfg, backbone, datas, todo: list[str], adalayers_epochs: int,
                   probe_steps: int = 2) -> dict[str, float]:
    """Measure a few steps of every variant still to run and print the scaled-up time (an estimate); returns
    the seconds per variant."""
    from adalayers.lab.multitask import estimate

    sizes = estimate.rows(datas)
    total, lines, secs_of = 0.0, [], {}
    for name in todo:
        if name in FROZEN:
            continue
        secs = estimate.finetune_seconds(estimate.finetune_costs(variant_config(mcfg, name), backbone, datas,
                                                                 probe_steps), sizes, mcfg.max_epochs)
        lines.append(f"  {name:22s} ~{secs / 60:7.1f} min ({mcfg.max_epochs} epochs)")
        total, secs_of[name] = total + secs, secs
    frozen = [n for n in todo if n in FROZEN]
    if frozen:
        costs = estimate.adalayers_costs(mcfg, backbone, datas, probe_steps)
        for i, name in enumerate(frozen):
            secs = estimate.adalayers_seconds(costs, sizes, adalayers_epochs, cache_built=i > 0)
            lines.append(f"  {name:22s} <{secs / 60:7.1f} min (at most {adalayers_epochs} epochs"
                         f"{', the first builds the hidden-state cache unless it exists' if i == 0 else ''})")
            total, secs_of[name] = total + secs, secs
    log.info("estimate for the %d variant(s) still to run, scaled from %d measured steps per task "
             "(an estimate: the machine's load changes it):\n%s\n  total ~%.1f h",
             len(todo), probe_steps, "\n".join(lines), total / 3600)
    return secs_of


def compare(mcfg, out: Path, variants=VARIANTS, adalayers_epochs: int | None = None, backbone=None,
            command: str = "", patience: int = 3, estimate: bool = True, train: bool = True,
            adalayers_lr: float = HEAD_LR) -> dict:
    """Run every variant not finished in `out` yet; a killed run continues with the next unfinished one.

    train=False runs nothing: the table of the variants finished so far, the others listed as not run.
    """
    from adalayers.model.backbone import Backbone
    from adalayers.lab.multitask import adalayers, trainer

    unknown = [v for v in variants if v not in VARIANTS]
    if unknown:
        raise ConfigError(f"--variants: unknown {unknown} (known: {', '.join(VARIANTS)})")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ada_epochs = adalayers_epochs or mcfg.max_epochs
    want = settings(mcfg, ada_epochs, patience, adalayers_lr)
    done = {n: r for n in variants if (r := finished(out, n, want)) is not None}
    todo = [n for n in variants if n not in done] if train else []
    if done:
        log.info("finished earlier (kept from %s): %s", out / RESULTS, ", ".join(done))
    backbone = backbone or Backbone.load(mcfg.base, device=pick_device(mcfg.device))
    datas = trainer.load_tasks(mcfg)
    main = {t: d.main_metric for t, d in datas.items()}
    estimates = _read_json(out / ESTIMATES)
    if todo and estimate:  # kept beside the results: the table shows each estimate next to the measured time
        estimates.update(print_estimate(mcfg, backbone, datas, todo, ada_epochs))
        runlib.write_json(out / ESTIMATES, estimates)
    for name in todo:
        log.info("[%s] starting", name)
        if name in FROZEN:
            r = adalayers.train_heads(mcfg, backbone, out / name, ada_epochs, patience,
                                      progressive=name == "adalayers-progressive", log=log.info, lr=adalayers_lr,
                                      train_rows={t: len(d.splits["train"]) for t, d in datas.items()})
        else:
            r = trainer.train(variant_config(mcfg, name), backbone, datas, log=log.info)
        done[name] = {"variant": name, **r}
        runlib.write_json(out / RESULTS / f"{name}.json", {**done[name], "settings": want})
        log.info("[%s] finished in %.0f s of training", name, r["train_seconds"])
    rows = [done[n] for n in variants if n in done]
    summary = _summary(mcfg, rows, main, command, backbone)
    summary["adalayers"] = {"max_epochs": ada_epochs, "early_stopping": patience, "lr": adalayers_lr}
    summary["estimate_s"] = {n: estimates[n] for n in variants if n in estimates}
    summary["not_run"] = [n for n in variants if n not in done]
    summary["partial"] = {n: p for n in summary["not_run"] if n in FROZEN
                          and (p := adalayers.finished_heads(mcfg, out / n, ada_epochs, patience, adalayers_lr))}
    runlib.write_json(out / "compare_multitask.json", summary)
    runlib.atomic_write(out / "compare_multitask.md", markdown(summary))
    chart(summary, out / "compare_multitask.png")
    return summary


def _read_json(path: Path) -> dict:
    """A small JSON file's mapping, or {} when there is none yet."""
    try:
        return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: not JSON ({e}); remove it") from None


def _summary(mcfg, rows, main, command, backbone) -> dict:
    return {"command": command, "config": mcfg.to_dict(), "main_metric": main, "variants": rows,
            "base_params": backbone.num_parameters(), "torch_threads": torch.get_num_threads(),
            "sizes": {"train_rows": mcfg.max_train_examples, "eval_rows": mcfg.max_eval_examples}}


def _train_rows(c: dict) -> str:
    """'all', '500', or per task where a task has its own cap: 'sst5 all, qqp 4000, stsb all'."""
    own = {t["name"]: t.get("max_train_examples") for t in c["tasks"]}
    if all(v is None for v in own.values()):
        return str(c["max_train_examples"] or "all")
    return ", ".join(f"{t} {v if v is not None else (c['max_train_examples'] or 'all')}" for t, v in own.items())


def markdown(s: dict) -> str:
    tasks = list(s["main_metric"])
    c = config_stored(s["config"])
    head = " | ".join(f"{t} dev {s['main_metric'][t]} | {t} test {s['main_metric'][t]}" for t in tasks)
    lines = [f"# Multi-task comparison on {c['base']}", "", f"Command: `{s['command']}`", "",
             f"Train rows per task {_train_rows(c)}, eval rows {c['max_eval_examples'] or 'all'}, "
             f"epochs {c['max_epochs']}, batch {c['batch_size']}, max_length {c['max_length']}, lr {c['lr']} "
             f"(heads {c['head_lr']}), schedule {c['schedule']}, seed {c['seed']}, torch threads "
             f"{s['torch_threads']}. Base parameters {s['base_params']:,}.", "",
             f"| variant | {head} | trainable params | train s | estimated s |",
             "|---|" + "---:|---:|" * len(tasks) + "---:|---:|---:|"]
    est = s.get("estimate_s", {})
    guess = lambda name: f"{est[name]:.0f}" if name in est else "-"  # noqa: E731
    for r in s["variants"]:
        cells = []
        for t in tasks:
            res = r["results"][t]
            cells += [f"{res['validation'][s['main_metric'][t]]:.3f}", f"{res['test'][s['main_metric'][t]]:.3f}"
                      if "test" in res else "-"]
        lines.append(f"| {r['variant']} | " + " | ".join(cells) + f" | {r['trainable_params']:,} | "
                     f"{r['train_seconds']:.0f} | {guess(r['variant'])} |")
    partial = s.get("partial", {})
    for name in s.get("not_run", []):
        p = partial.get(name)
        if p is None:
            lines.append(f"| {name} | " + " | ".join(["not run"] * 2 * len(tasks)) + f" | - | - | {guess(name)} |")
            continue
        cells = []
        for t in tasks:
            res = p["results"].get(t)
            cells += ["not run"] * 2 if res is None else [f"{res[split][s['main_metric'][t]]:.3f}" if split in res
                                                          else "-" for split in ("validation", "test")]
        lines.append(f"| {name} (unfinished: {', '.join(p['tasks'])} only) | " + " | ".join(cells)
                     + f" | {p['trainable_params']:,} ({', '.join(p['tasks'])}) | {p['train_seconds']:.0f} | "
                     f"{guess(name)} |")
    if s.get("not_run"):
        lines += ["", f"Not run (or unfinished): {', '.join(s['not_run'])}. The same command continues with them "
                      "(finished variants are kept in the output folder's variants/, finished AdaLayers heads in "
                      "<variant>/<task>/)."]
    deps = {t["name"]: t["depends_on"] for t in c["tasks"] if t["depends_on"]}
    ada = s.get("adalayers", {})
    lines += ["", "Each variant changes one thing against the baseline (independent heads, shared base fine-tuned): "
              f"progressive = depends_on {deps or '(none in this config)'} with upstream heads "
              f"{'frozen' if c['freeze_upstream'] else 'trained'} by downstream losses; pcgrad = gradient surgery on "
              "the shared base (a step = one batch of every task); smart = SMART (eps "
              f"{c['smart']['eps']}, {c['smart']['steps']} ascent step(s), lambda_s {c['smart']['lambda_s']}, "
              f"mu {c['smart']['mu']}); freeze-top3 = only the last 3 layers of the base train; adalayers = "
              "frozen base, one mixer + head per task trained on its own (pair tasks as cross-encoder input; "
              f"lr {ada.get('lr', HEAD_LR):g}, at most {ada.get('max_epochs', '?')} epochs, early stopping after "
              f"{ada.get('early_stopping', '?')} without improvement); adalayers-progressive = "
              "the same, but each head also reads the outputs of the frozen heads it depends_on.",
              "Dev = the task's validation split (SST: dev.txt; QQP: 10% of the subset; STS-B: 10% of train); "
              "test = SST test.txt, QQP's other 10%, STS-B GLUE dev. The best epoch is picked on the mean dev "
              "metric (adalayers: per task)."]
    if est:
        lines += ["", "Estimated s: the start-up estimate (a few measured steps scaled to the data, "
                      "lab/multitask/estimate.py) under the load of that moment; for AdaLayers an upper bound (every "
                      "epoch run, the first variant building the hidden-state cache). Train s: measured."]
    return "\n".join(lines) + "\n"


def chart(s: dict, path: Path) -> None:
    import numpy as np

    from adalayers.lab.figures import pyplot, save_figure

    plt = pyplot()

    tasks, rows = list(s["main_metric"]), s["variants"]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    width = 0.8 / max(len(rows), 1)
    for ax, split in zip(axes, ("validation", "test")):
        for i, r in enumerate(rows):
            vals = [r["results"][t].get(split, {}).get(s["main_metric"][t], np.nan) for t in tasks]
            ax.bar(np.arange(len(tasks)) + i * width, vals, width, label=r["variant"])
        ax.set_xticks(np.arange(len(tasks)) + width * (len(rows) - 1) / 2)
        ax.set_xticklabels([f"{t}\n({s['main_metric'][t]})" for t in tasks])
        ax.set_title("dev" if split == "validation" else "test")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(f"multi-task recipes on {s['config']['base']}")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def cmd_compare_multitask(args) -> int:
    from adalayers.lab.multitask.config import load

    if args.threads:
        torch.set_num_threads(args.threads)
    overrides = list(args.overrides)
    for field, value in (("max_train_examples", args.train_rows), ("max_eval_examples", args.eval_rows),
                         ("max_epochs", args.epochs)):
        if value is not None:
            overrides.append(f"{field}={value}")
    mcfg = load(args.config, overrides)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    s = compare(mcfg, Path(args.out), variants, args.adalayers_epochs, command=_command(args),
                patience=args.adalayers_patience, estimate=not args.no_estimate, train=not args.report_only,
                adalayers_lr=args.adalayers_lr)
    print(markdown(s))
    print(f"written: {Path(args.out) / 'compare_multitask.md'} (.json, .png)")
    return 0


def _command(args) -> str:
    parts = ["adalayers", "compare-multitask", args.config, "--out", args.out]
    for flag, value in (("--train-rows", args.train_rows), ("--eval-rows", args.eval_rows), ("--epochs", args.epochs),
                        ("--adalayers-epochs", args.adalayers_epochs), ("--threads", args.threads)):
        if value is not None:
            parts += [flag, str(value)]
    if args.adalayers_patience != 3:
        parts += ["--adalayers-patience", str(args.adalayers_patience)]
    if args.adalayers_lr != HEAD_LR:
        parts += ["--adalayers-lr", str(args.adalayers_lr)]
    if args.variants != ",".join(VARIANTS):
        parts += ["--variants", args.variants]
    for o in args.overrides:
        parts += ["--set", o]
    return " ".join(shlex.quote(p) for p in parts)


def add_commands(sub) -> None:
    p = sub.add_parser("compare-multitask", help="multi-task recipes (progressive sharing, PCGrad, SMART, "
                                                 "freezing) against AdaLayers, per task")
    p.add_argument("config", help="multi-task YAML config (see configs/multitask.yaml)")
    p.add_argument("--out", required=True, help="folder for compare_multitask.json / .md / .png")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   help="override a config field, e.g. --set lr=3e-5 --set smart.eps=1e-2 (repeatable)")
    p.add_argument("--train-rows", type=int, help="training rows per task (default: the config's)")
    p.add_argument("--eval-rows", type=int, help="validation and test rows per task (default: the config's)")
    p.add_argument("--epochs", type=int, help="epochs of the multi-task variants (default: the config's)")
    p.add_argument("--adalayers-epochs", type=int, help="at most this many epochs of the AdaLayers heads "
                                                         "(default: --epochs)")
    p.add_argument("--adalayers-patience", type=int, default=3,
                   help="AdaLayers heads stop after this many epochs without validation improvement (default 3)")
    p.add_argument("--adalayers-lr", type=float, default=HEAD_LR,
                   help=f"AdamW learning rate of the AdaLayers heads (default {HEAD_LR:g})")
    p.add_argument("--no-estimate", action="store_true", help="skip the measured time estimate at the start")
    p.add_argument("--report-only", action="store_true",
                   help="train nothing: write the table of the variants finished in --out so far (the others "
                        "listed as not run)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {','.join(VARIANTS)}")
    p.add_argument("--threads", type=int, help="torch CPU threads")
    p.set_defaults(fn=cmd_compare_multitask)
