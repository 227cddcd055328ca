"""The table and the evidence of benchmarks/mixer_remedies.sh, from its output folder: OUT/results.md, OUT/results.json.

    python benchmarks/mixer_remedies.py OUT [--keep DEST] [--metric mcc]   # DEST: e.g. benchmarks/results/mixer_remedies

For every row folder OUT/<row>/ (an `adalayers train --seeds N` folder): test and validation score (the task's
main metric: MCC for CoLA, F1 for CoNLL, accuracy for IMDB) as median
(min-max) over the seeds, the best epochs, the final layer weights (median over the seeds). Then, per row, the
first seed's curve epoch by epoch: train loss, validation score, the largest layer weight and the weights of the
layers that end up on top (from its log.jsonl). A row whose runs are missing is left out and named.
"""
import json
from pathlib import Path

from adalayers.lab.seeds import cell

ORDER = ["default", "layerN", "layer_dropout", "layer_dropout4", "alpha8", "logit_lr10", "logit_lr01",
         "entropy", "freeze2", "freeze3", "learn_after3", "warmup2", "init_middle", "alpha8_init_middle", "nocut",
         "holdout10", "holdout20", "holdout20_step"]


def row_names(out: Path) -> list[str]:
    found = [d.name for d in out.iterdir() if (d / "metrics.json").is_file()]
    def key(n: str) -> tuple:
        layer = n.removeprefix("layer")
        if layer.isdigit():  # pinned layers after the default, in layer order
            return ORDER.index("layerN"), int(layer), n
        return (ORDER.index(n) if n in ORDER else len(ORDER)), 0, n
    return sorted(found, key=key)


def settings(run: Path) -> str:
    """The mixer settings that differ between rows, read from the first seed's saved config."""
    cfg = json.loads((run / "config.json").read_text())
    cfg = cfg.get("config", cfg)
    m = cfg["mixer"]
    return (f"base {cfg['model']['base']}, alpha {m['alpha']}, cutoff {m['cutoff']}, pin_layer {m['pin_layer']}, "
            f"layer_dropout {m.get('layer_dropout', 0.0)}, logit_lr_scale {m.get('logit_lr_scale', 1.0)}, "
            f"entropy_lambda {m['entropy_lambda']}, freeze_after {m.get('freeze_after')}, "
            f"learn_after {m.get('learn_after', 0)}, warmup_epochs {m.get('warmup_epochs', 0)}, "
            f"init_layer {m.get('init_layer')} (share {m.get('init_share', 0.5)}), "
            f"holdout {m.get('holdout', 0.0)} (pace {m.get('holdout_pace', 'epoch')}), "
            f"lr {cfg['train']['lr']}, max_epochs {cfg['train']['max_epochs']}")


def main_metric(out: Path, rows: list[str]) -> str:
    """The task's main metric, from the first row's first seed (its config.json)."""
    m = json.loads((out / rows[0] / "metrics.json").read_text())
    return json.loads((out / rows[0] / m["runs"][0] / "config.json").read_text()).get("main_metric", "mcc")


def curve(run: Path, top: list[int], metric: str) -> list[str]:
    """One row per epoch of run's log.jsonl; `top`: the layers whose weights get a column (none for a pinned
    run, whose weights are one-hot)."""
    cols = "".join(f" w{i} |" for i in top)
    lines = [f"| epoch | train loss | val {metric} | max weight (layer) | cut layers |{cols}",
             "|---|---|---|---|---|" + "---|" * len(top)]
    for line in (run / "log.jsonl").read_text().splitlines():
        e = json.loads(line)
        w = e.get("layer_weights") or []
        big = max(range(len(w)), key=w.__getitem__) if w else None
        star = " *" if e.get("best") else ""
        lines.append(f"| {e['epoch']}{star} | {e['train_loss']:.4f} | {e['validation'][metric]:.4f} | "
                     + (f"{w[big]:.3f} ({big})" if w else "") + " | "
                     + (" ".join(str(i) for i, x in enumerate(w) if x == 0) if w and max(w) < 1 else "all others")
                     + " |" + "".join(f" {w[i]:.3f} |" for i in top))
    return lines


def candidates(row: Path, k: int = 3) -> list[list[int]]:
    """Per seed of a mixer row, the layers `train --select-layers k` would train alone (adalayers.recipes.select)."""
    from adalayers.recipes.select import candidate_layers, peak_weights

    m = json.loads((row / "metrics.json").read_text())
    picks = []
    for run in m["runs"]:
        seed = row / run
        entries = [json.loads(line) for line in (seed / "log.jsonl").read_text().splitlines() if line.strip()]
        best = json.loads((seed / "metrics.json").read_text()).get("best_epoch")
        picks.append(candidate_layers(peak_weights(entries, best), k))
    return picks


def log_of(out: Path, row: str) -> list[dict]:
    m = json.loads((out / row / "metrics.json").read_text())
    return [json.loads(x) for x in (out / row / m["runs"][0] / "log.jsonl").read_text().splitlines()]


def figure(out: Path, rows: list[str], pinned: set[int], metric: str) -> None:
    """OUT/curves.png: every row's validation score and training loss by epoch (first seed), and the default
    row's layer weights by epoch (its 5 largest at the end, the pinned rows' layers and the last layer)."""
    from adalayers.lab.figures import pyplot, save_figure

    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for row in rows:
        log = log_of(out, row)
        epochs = [e["epoch"] for e in log]
        axes[0].plot(epochs, [e["validation"][metric] for e in log], label=row)
        axes[1].plot(epochs, [e["train_loss"] for e in log], label=row)
    axes[0].set(title=f"validation {metric} (first seed)", xlabel="epoch", ylabel=metric)
    axes[1].set(title="training loss (first seed)", xlabel="epoch", ylabel="loss")
    axes[0].legend(fontsize=7)
    if "default" in rows:
        log = log_of(out, "default")
        w = [e["layer_weights"] for e in log]
        top = sorted(range(len(w[-1])), key=lambda i: -w[-1][i])[:5]
        for i in sorted(set(top) | pinned | {len(w[-1]) - 1}):
            axes[2].plot([e["epoch"] for e in log], [x[i] for x in w], label=f"layer {i}")
        best = next((e["epoch"] for e in reversed(log) if e.get("best")), None)
        if best:
            axes[2].axvline(best, color="grey", linestyle=":", label=f"best epoch {best}")
        axes[2].set(title="the default mixer's layer weights (first seed)", xlabel="epoch", ylabel="weight")
        axes[2].legend(fontsize=7)
    fig.suptitle(f"{out.name}: the mixer's remedies, epoch by epoch")
    fig.tight_layout()
    save_figure(fig, out / "curves.png")


def main(out: Path, metric: str | None = None) -> str:
    rows, data = row_names(out), {}
    metric = metric or (main_metric(out, rows) if rows else "mcc")
    md = [f"| row | settings | test {metric} median (min–max) | validation {metric} median (min–max) | best epochs | "
          "layer weights of the kept (best) epoch, median over seeds |", "|---|---|---|---|---|---|"]
    for name in rows:
        m = json.loads((out / name / "metrics.json").read_text())
        first = out / name / m["runs"][0]
        best = [int(x) for x in m["spread"]["best_epoch"]["values"]] if "best_epoch" in m["spread"] else []
        weights = m.get("layer_weights") or []
        data[name] = {"settings": settings(first), "seeds": m["seeds"], "metric": metric, "test": m["spread"]["test"][metric],
                      "validation": m["spread"]["validation"][metric], "best_epochs": best,
                      "layer_weights": weights, "train_seconds_total": m.get("train_seconds_total")}
        md.append(f"| {name} | {data[name]['settings']} | {cell(m['spread']['test'][metric])} | "
                  f"{cell(m['spread']['validation'][metric])} | {', '.join(map(str, best))} | "
                  + " ".join(f"{x:.2f}" for x in weights) + " |")
    base = data[rows[0]]["settings"].split(",")[0].removeprefix("base ") if data else "BASE"
    command = (out / "command.txt").read_text().strip() if (out / "command.txt").is_file() else \
        f"BASE={base} CONFIG=configs/cola.yaml bash benchmarks/mixer_remedies.sh OUT ROWS"
    md[:0] = [f"Made by `{command.replace('ROWS', ' '.join(rows))}`: each row is `adalayers train CONFIG --seeds SEEDS "
              "--out OUT/ROW --set model.base=BASE --set train.num_threads=1 --set cache.enabled=true` plus SET and "
              "the row's --set (the script's ROWS), from the hidden-state cache, 1 torch thread. Every setting not in "
              "the table is CONFIG's.", ""]
    md.append("\n" + "; ".join(f"{n}: seeds {', '.join(map(str, d['seeds']))}" for n, d in data.items()) + "."
              if data else "\nNo finished rows.")
    picks = {n: candidates(out / n) for n in rows if "pin_layer None" in data[n]["settings"]}
    if picks:  # what the safety net would train beside each mixer row
        md.append("\n`train --select-layers 3` would train these layers alone beside the mixer (its 3 largest peak "
                  "weights up to its best epoch, and the middle layer), seed by seed: "
                  + "; ".join(f"{n}: " + ", ".join(str(c) for c in cs) for n, cs in picks.items()) + ".")
    pinned = {int(d["settings"].split("pin_layer ")[1].split(",")[0]) for d in data.values()
              if "pin_layer None" not in d["settings"]}
    for name in rows:
        m = json.loads((out / name / "metrics.json").read_text())
        first = out / name / m["runs"][0]
        w = data[name]["layer_weights"]
        # the 5 layers on top at the end, every pinned row's layer and the last layer
        watch = set(sorted(range(len(w)), key=lambda i: -w[i])[:5]) | pinned | {len(w) - 1}
        top = sorted(i for i in watch if i < len(w)) if len(w) > 1 and max(w) < 1 else []
        md += ["", f"## {name}, {m['runs'][0]}: epoch by epoch (* = best on validation so far)", ""]
        md += curve(first, top, metric)
    if data:
        figure(out, rows, pinned, metric)
    (out / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    text = "\n".join(md) + "\n"
    (out / "results.md").write_text(text)
    return text


KEPT = ("results.md", "results.json", "curves.png")  # the summary; each run's files stay in OUT (and git history)


def keep(out: Path, dest: Path) -> None:
    """Copy OUT's table, its JSON (every row's settings and spread) and figure to DEST, the data folder written
    as $ADALAYERS_DATA and the repository's paths relative to it (adalayers.lab.portable)."""
    from adalayers.lab.portable import keep as keep_portable

    keep_portable(out, dest, KEPT, Path(__file__).resolve().parents[1])


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--keep", type=Path, metavar="DEST", help="copy the table, its JSON and the figure to DEST")
    ap.add_argument("--metric", help="the score the table shows (default: the task's main metric)")
    args = ap.parse_args()
    print(main(args.out, args.metric))
    if args.keep:
        keep(args.out, args.keep)
