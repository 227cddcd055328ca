"""Adapter span ablation (Houlsby et al. 2019, figure 6; the seed report's figure 8).

Switch off the trained adapters of every contiguous span of layers first..last and re-evaluate
without retraining. Cell (first, last) holds the relative drop of the metric against the model
with all adapters: (full - ablated) / |full|; the lower triangle is empty. The diagonal removes
one layer's adapters; the top-right cell removes all of them.
"""
from __future__ import annotations

from pathlib import Path

from adalayers.store import run as runlib
from adalayers.errors import DataError, RunError


def ablate(run_dir: Path, split: str = "validation", metric: str | None = None, backbone=None) -> dict:
    from adalayers.recipes import service
    from adalayers.lab.strategies.adapters import AdapterModel
    from adalayers.lab.strategies.saved import load_run
    from adalayers.lab.strategies.harness import evaluate
    from adalayers.model.precision import autocast_for

    run_dir = Path(run_dir)
    strategy, model, cfg, backbone, meta = load_run(run_dir, backbone)
    if not isinstance(model, AdapterModel):
        raise RunError(f"{run_dir}: strategy {meta['spec']!r} has no adapters to ablate")
    _, data, encoded = service.prepare(cfg, backbone)
    if split not in encoded:
        raise DataError(f"task {data.name} has no {split} split")
    metric = metric or data.main_metric
    autocast = autocast_for(cfg.train.precision, backbone.device)

    def score() -> float:
        result = evaluate(model, encoded[split], data.splits[split], cfg.train.eval_batch_size, model.pad_id, autocast)
        if metric not in result:
            raise DataError(f"--metric {metric!r}: the task reports {', '.join(k for k in result if k != 'n')}")
        return float(result[metric])

    L = len(model.base.layers)
    model.disabled = set()
    full = score()
    scores = [[None] * L for _ in range(L)]
    drops = [[None] * L for _ in range(L)]
    for first in range(1, L + 1):
        for last in range(first, L + 1):
            model.disabled = set(range(first, last + 1))
            s = score()
            scores[first - 1][last - 1] = s
            drops[first - 1][last - 1] = (full - s) / abs(full) if full else None
    model.disabled = set()
    result = {"spec": meta["spec"], "split": split, "metric": metric, "full": full, "layers": L,
              "rows": "first ablated layer (1..L)", "columns": "last ablated layer (1..L)",
              "scores": scores, "relative_drop": drops}
    runlib.write_json(run_dir / "ablation.json", result)
    png = run_dir / "ablation.png"
    heatmap(result, png)
    return {**result, "png": png}


def heatmap(result: dict, path: Path) -> None:
    import numpy as np

    from adalayers.lab.figures import pyplot, save_figure

    plt = pyplot()

    L = result["layers"]
    grid = np.array([[np.nan if v is None else 100 * v for v in row] for row in result["relative_drop"]])
    fig, ax = plt.subplots(figsize=(1.0 + 0.6 * L, 0.6 + 0.6 * L))
    im = ax.imshow(grid, cmap="Reds", vmin=min(0.0, np.nanmin(grid)) if np.isfinite(grid).any() else 0)
    for i in range(L):
        for j in range(i, L):
            if np.isfinite(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:.0f}", ha="center", va="center", fontsize=7)
    ax.set_xticks(range(L), range(1, L + 1))
    ax.set_yticks(range(L), range(1, L + 1))
    ax.set_xlabel("last layer ablated")
    ax.set_ylabel("first layer ablated")
    ax.set_title(f"{result['spec']}: relative drop in {result['split']} {result['metric']} (%)\n"
                 f"all adapters: {result['full']:.3f}", fontsize=9)
    fig.colorbar(im, ax=ax, fraction=0.046)
    fig.tight_layout()
    save_figure(fig, path, dpi=110)


def add_commands(sub) -> None:
    p = sub.add_parser("ablate-adapters", help="switch off trained adapters of every contiguous layer span and "
                                               "re-evaluate (writes ablation.json and ablation.png)")
    p.add_argument("run", help="an adapters strategy folder written by 'adalayers compare'")
    p.add_argument("--split", default="validation", choices=["validation", "test"],
                   help="the split to re-evaluate on (default: validation, so the test split stays unseen)")
    p.add_argument("--metric", help="metric to compare (default: the task's main metric)")
    p.set_defaults(fn=_cmd)


def _cmd(args) -> int:
    result = ablate(Path(args.run), args.split, args.metric)
    print(f"{result['spec']}: all adapters {result['metric']} = {result['full']:.4f}")
    for first, row in enumerate(result["relative_drop"], start=1):
        print(f"  from layer {first}: " + " ".join("   . " if v is None else f"{100 * v:5.1f}" for v in row))
    print(f"heatmap: {result['png']}")
    return 0
