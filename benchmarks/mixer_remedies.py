"""The table and the evidence of benchmarks/mixer_remedies.sh, from its output folder: OUT/results.md, OUT/results.json.

    python benchmarks/mixer_remedies.py OUT

For every row folder OUT/<row>/ (an `adalayers train --seeds N` folder): test and validation MCC as median
(min-max) over the seeds, the best epochs, the final layer weights (median over the seeds). Then, per row, the
first seed's curve epoch by epoch: train loss, validation MCC, the largest layer weight and the weights of the
layers that end up on top (from its log.jsonl). A row whose runs are missing is left out and named.
"""
import json
import sys
from pathlib import Path

from adalayers.lab.seeds import cell

ORDER = ["default", "layer6", "layer3", "layer9", "layer12", "layer_dropout", "layer_dropout4", "alpha8", "logit_lr10", "logit_lr01",
         "entropy", "freeze2", "freeze3", "learn_after3", "warmup2", "init_middle"]


def row_names(out: Path) -> list[str]:
    found = [d.name for d in out.iterdir() if (d / "metrics.json").is_file()]
    return sorted(found, key=lambda n: (ORDER.index(n) if n in ORDER else len(ORDER), n))


def settings(run: Path) -> str:
    """The mixer settings that differ between rows, read from the first seed's saved config."""
    cfg = json.loads((run / "config.json").read_text())
    cfg = cfg.get("config", cfg)
    m = cfg["mixer"]
    return (f"base {cfg['model']['base']}, alpha {m['alpha']}, cutoff {m['cutoff']}, pin_layer {m['pin_layer']}, "
            f"layer_dropout {m.get('layer_dropout', 0.0)}, logit_lr_scale {m.get('logit_lr_scale', 1.0)}, "
            f"entropy_lambda {m['entropy_lambda']}, freeze_after {m.get('freeze_after')}, "
            f"learn_after {m.get('learn_after', 0)}, warmup_epochs {m.get('warmup_epochs', 0)}, "
            f"init_layer {m.get('init_layer')} (share {m.get('init_share', 0.5)}), lr {cfg['train']['lr']}, max_epochs {cfg['train']['max_epochs']}")


def curve(run: Path, top: list[int]) -> list[str]:
    """One row per epoch of run's log.jsonl; `top`: the layers whose weights get a column (none for a pinned
    run, whose weights are one-hot)."""
    cols = "".join(f" w{i} |" for i in top)
    lines = [f"| epoch | train loss | val MCC | max weight (layer) | cut layers |{cols}",
             "|---|---|---|---|---|" + "---|" * len(top)]
    for line in (run / "log.jsonl").read_text().splitlines():
        e = json.loads(line)
        w = e.get("layer_weights") or []
        big = max(range(len(w)), key=w.__getitem__) if w else None
        star = " *" if e.get("best") else ""
        lines.append(f"| {e['epoch']}{star} | {e['train_loss']:.4f} | {e['validation']['mcc']:.4f} | "
                     + (f"{w[big]:.3f} ({big})" if w else "") + " | "
                     + (" ".join(str(i) for i, x in enumerate(w) if x == 0) if w and max(w) < 1 else "all others")
                     + " |" + "".join(f" {w[i]:.3f} |" for i in top))
    return lines


def log_of(out: Path, row: str) -> list[dict]:
    m = json.loads((out / row / "metrics.json").read_text())
    return [json.loads(x) for x in (out / row / m["runs"][0] / "log.jsonl").read_text().splitlines()]


def figure(out: Path, rows: list[str], pinned: set[int]) -> None:
    """OUT/curves.png: every row's validation MCC and training loss by epoch (first seed), and the default
    row's layer weights by epoch (its 5 largest at the end, the pinned rows' layers and the last layer)."""
    from adalayers.lab.figures import pyplot, save_figure

    plt = pyplot()
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    for row in rows:
        log = log_of(out, row)
        epochs = [e["epoch"] for e in log]
        axes[0].plot(epochs, [e["validation"]["mcc"] for e in log], label=row)
        axes[1].plot(epochs, [e["train_loss"] for e in log], label=row)
    axes[0].set(title="validation MCC (first seed)", xlabel="epoch", ylabel="MCC")
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


def main(out: Path) -> str:
    rows, data = row_names(out), {}
    md = ["| row | settings | test MCC median (min–max) | validation MCC median (min–max) | best epochs | "
          "layer weights of the kept (best) epoch, median over seeds |", "|---|---|---|---|---|---|"]
    for name in rows:
        m = json.loads((out / name / "metrics.json").read_text())
        first = out / name / m["runs"][0]
        best = [int(x) for x in m["spread"]["best_epoch"]["values"]] if "best_epoch" in m["spread"] else []
        weights = m.get("layer_weights") or []
        data[name] = {"settings": settings(first), "seeds": m["seeds"], "test_mcc": m["spread"]["test"]["mcc"],
                      "validation_mcc": m["spread"]["validation"]["mcc"], "best_epochs": best,
                      "layer_weights": weights, "train_seconds_total": m.get("train_seconds_total")}
        md.append(f"| {name} | {data[name]['settings']} | {cell(m['spread']['test']['mcc'])} | "
                  f"{cell(m['spread']['validation']['mcc'])} | {', '.join(map(str, best))} | "
                  + " ".join(f"{x:.2f}" for x in weights) + " |")
    base = data[rows[0]]["settings"].split(",")[0].removeprefix("base ") if data else "BASE"
    md[:0] = [f"Made by `BASE={base} bash benchmarks/mixer_remedies.sh OUT {' '.join(rows)}`: each row is `adalayers "
              "train configs/cola.yaml --seeds 3 --out OUT/ROW --set model.base=BASE --set train.num_threads=1 --set "
              "cache.enabled=true` plus the row's --set (the script's ROWS), from the hidden-state cache, 1 torch "
              "thread, one run at a time. Every setting not in the table is configs/cola.yaml's.", ""]
    md.append("\n" + "; ".join(f"{n}: seeds {', '.join(map(str, d['seeds']))}" for n, d in data.items()) + "."
              if data else "\nNo finished rows.")
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
        md += curve(first, top)
    if data:
        figure(out, rows, pinned)
    (out / "results.json").write_text(json.dumps(data, indent=1) + "\n")
    text = "\n".join(md) + "\n"
    (out / "results.md").write_text(text)
    return text


if __name__ == "__main__":
    print(main(Path(sys.argv[1])))
