"""compare.json, compare.md and compare.png from the results of `adalayers compare`."""
from __future__ import annotations

from pathlib import Path

from adalayers.store import run as runlib
from adalayers.lab.seeds import cell
from adalayers.kinds import TaskKind

SHOWN = {TaskKind.CLASSIFICATION: ("mcc", "accuracy"), TaskKind.TOKENS: ("f1",), TaskKind.REGRESSION: ("pearson", "spearman")}


def _metrics(r: dict) -> list[str]:
    test = r.get("test") or {}
    names = [r["main_metric"]] + [m for ms in SHOWN.values() for m in ms if m in test and m != r["main_metric"]]
    return [m for m in names if m in test]


def _fmt_params(n: int) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e3 else str(n)


def markdown(summary: dict) -> str:
    rows = summary["strategies"]
    metrics = _metrics(rows[0])
    cfg = summary["config"]
    lines = [f"# Strategy comparison: {cfg['task']['name']} on {cfg['model']['base']}", "",
             f"Command: `{summary['command']}`", "",
             f"Device: {summary['device']}, torch threads {summary['torch_threads']}; "
             f"train rows {cfg['task']['max_train_examples'] or 'all'}, eval rows "
             f"{cfg['task']['max_eval_examples'] or 'all'}, max epochs {cfg['train']['max_epochs']}, "
             f"batch {cfg['train']['batch_size']}, seed {cfg['train']['seed']}.", "",
             "| strategy | " + " | ".join(f"test {m}" for m in metrics) +
             " | trainable params | % of base | train s | infer s/1k (1 task) | infer s/1k (4 tasks) "
             "| peak MB (above base) | main model |",
             "|---|" + "---:|" * len(metrics) + "---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        test = r.get("test") or {}
        inf = r["inference_s_per_1000"]
        above = r.get("peak_above_loaded_mb")
        mem = f"{r['peak_rss_mb']:.0f} ({above:+.0f})" if above is not None else f"{r['peak_rss_mb']:.0f}"
        if r.get("peak_gpu_mb") is not None:
            mem += f", GPU {r['peak_gpu_mb']:.0f}"
        spread = (r.get("spread") or {}).get("test") or {}
        lines.append(f"| {r['spec']} | " + " | ".join(cell(spread.get(m), "{:.3f}") or f"{test.get(m, float('nan')):.3f}"
                                                    for m in metrics) +
                     f" | {_fmt_params(r['trainable_params'])} | {r['trainable_pct_of_base']:.2f} | "
                     f"{r['train_seconds']:.0f} | {inf['1']:.2f} | {inf['4']:.2f} | {mem} | {r['main_model']} "
                     f"({'bit-identical' if r['base_bit_identical'] else 'NOT identical'}) |")
    if any(r.get("seeds") for r in rows):
        n = max(len(r.get("seeds") or [0]) for r in rows)
        lines += ["", f"Every strategy trained with {n} seeds: test metrics are medians with min–max in brackets; "
                      f"training and inference times are medians (one folder per seed)."]
    lines += ["", f"The base pass alone: {rows[0]['base_pass_s_per_1000']:.2f} s per 1,000 rows; "
                  f"base parameters {rows[0]['base_params']:,}.", ""]
    lines += [f"- {n}" for n in summary["notes"]]
    extras = [(r["spec"], r["extra"]) for r in rows if r.get("extra")]
    if extras:
        lines += ["", "Strategy details:", ""]
        for spec, extra in extras:
            shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in extra.items()
                     if not isinstance(v, list) or len(v) <= 13}
            shown = {k: ([round(x, 3) for x in v] if isinstance(v, list) and v and isinstance(v[0], float) else v)
                     for k, v in shown.items()}
            lines.append(f"- {spec}: {shown}")
    return "\n".join(lines) + "\n"


def chart(summary: dict, path: Path) -> None:
    import numpy as np

    from adalayers.lab.figures import pyplot, save_figure

    plt = pyplot()

    rows = summary["strategies"]
    names = [r["spec"] for r in rows]
    main = rows[0]["main_metric"]
    x = np.arange(len(rows))
    fig, axes = plt.subplots(2, 3, figsize=(15, 8))
    panels = [
        (f"test {main}", [(r.get("test") or {}).get(main, float("nan")) for r in rows], False),
        ("trainable parameters (% of base, log)", [max(r["trainable_pct_of_base"], 1e-4) for r in rows], True),
        ("training seconds", [r["train_seconds"] for r in rows], False),
        (None, None, False),
        ("peak resident memory MB (above loaded base)", [r.get("peak_above_loaded_mb") or 0 for r in rows], False),
    ]
    for ax, (title, values, log) in zip(axes.flat, panels):
        if title is None:
            w = 0.4
            ax.bar(x - w / 2, [r["inference_s_per_1000"]["1"] for r in rows], w, label="1 task")
            ax.bar(x + w / 2, [r["inference_s_per_1000"]["4"] for r in rows], w, label="4 tasks")
            ax.set_title("inference seconds per 1,000 rows")
            ax.legend()
        else:
            ax.bar(x, values, color=["tab:green" if r["shares_base_pass"] else "tab:orange" for r in rows])
            ax.set_title(title)
            if log:
                ax.set_yscale("log")
        ax.set_xticks(x, names, rotation=40, ha="right", fontsize=8)
    axes.flat[5].axis("off")
    axes.flat[5].text(0, 0.5, "green: shares the base's forward pass\norange: needs its own full pass",
                      fontsize=11, va="center")
    cfg = summary["config"]
    fig.suptitle(f"{cfg['task']['name']} on {cfg['model']['base']}")
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def write_report(out: Path, summary: dict) -> None:
    out = Path(out)
    runlib.write_json(out / "compare.json", summary)
    runlib.atomic_write(out / "compare.md", markdown(summary))
    chart(summary, out / "compare.png")
