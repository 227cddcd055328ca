"""Figures shared by reports, sweeps and comparisons: matplotlib without a display, written atomically.

Every plot has a title, labelled axes and layer numbers (layer 0 = the embedding output), so a PNG
reads without the code that made it.
"""
from __future__ import annotations

import io
import math
from pathlib import Path

import numpy as np

from adalayers.store import run as runlib


def layer_names(n: int) -> list[str]:
    return ["0\n(emb)"] + [str(i) for i in range(1, n)]



def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: Path, dpi: int = 120) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight")
    pyplot().close(fig)
    runlib.atomic_write(path, buf.getvalue())


def plot_layer_weights(weights: list[float], title: str, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(max(5.0, 0.5 * len(weights) + 2), 3.6))
    x = np.arange(len(weights))
    bars = ax.bar(x, weights, color=["tab:blue" if w > 0 else "lightgray" for w in weights])
    for b, w in zip(bars, weights):
        if w > 0:
            ax.annotate(f"{w:.2f}", (b.get_x() + b.get_width() / 2, w), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(x, layer_names(len(weights)))
    ax.set_xlabel("layer of the base (0 = embedding output)")
    ax.set_ylabel("layer weight")
    ax.set_ylim(0, max(weights) * 1.15 if max(weights) > 0 else 1)
    ax.set_title(title)
    save_figure(fig, path)


def plot_layer_history(history: list[tuple[int, list[float]]], title: str, path: Path) -> None:
    plt = pyplot()
    epochs = [e for e, _ in history]
    w = np.array([ws for _, ws in history])
    fig, ax = plt.subplots(figsize=(7, 4))
    cmap = plt.get_cmap("viridis")
    for i in range(w.shape[1]):
        ax.plot(epochs, w[:, i], marker="o", ms=3, color=cmap(i / max(1, w.shape[1] - 1)),
                label="layer 0 (emb)" if i == 0 else f"layer {i}")
    ax.set_xlabel("epoch (0 = initialisation)")
    ax.set_ylabel("layer weight")
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_ylim(0, min(1.0, w.max() * 1.1 + 0.02))
    ax.set_title(title)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8, title="base layer")
    ax.grid(alpha=0.3)
    save_figure(fig, path)


def plot_training_curves(log: list[dict], metric: str, title: str, path: Path) -> None:
    plt = pyplot()
    epochs = [e["epoch"] for e in log]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    a1.plot(epochs, [e["train_loss"] for e in log], marker="o", ms=3)
    a1.set_xlabel("epoch")
    a1.set_ylabel("mean training loss")
    a1.set_title("training loss")
    vals = [e["validation"].get(metric, math.nan) for e in log]
    a2.plot(epochs, vals, marker="o", ms=3, color="tab:green")
    best = [e for e in log if e.get("best")]
    if best:
        b = max(best, key=lambda e: e["validation"].get(metric, -math.inf))
        a2.scatter([b["epoch"]], [b["validation"][metric]], s=80, facecolors="none", edgecolors="red",
                   label=f"best epoch {b['epoch']}", zorder=3)
        a2.legend()
    a2.set_xlabel("epoch")
    a2.set_ylabel(f"validation {metric}")
    a2.set_title(f"validation {metric}")
    from matplotlib.ticker import MaxNLocator

    for a in (a1, a2):
        a.grid(alpha=0.3)
        a.xaxis.set_major_locator(MaxNLocator(integer=True))
    fig.suptitle(title)
    save_figure(fig, path)


def plot_confusion(matrix: np.ndarray, labels: list[str], title: str, path: Path) -> None:
    plt = pyplot()
    n = len(labels)
    fig, ax = plt.subplots(figsize=(1.2 * n + 2.5, 1.0 * n + 2))
    im = ax.imshow(matrix, cmap="Blues")
    for i in range(n):
        for j in range(n):
            ax.text(j, i, f"{matrix[i, j]:,}", ha="center", va="center",
                    color="white" if matrix[i, j] > matrix.max() / 2 else "black")
    ax.set_xticks(range(n), labels, rotation=30, ha="right")
    ax.set_yticks(range(n), labels)
    ax.set_xlabel("predicted label")
    ax.set_ylabel("true label")
    ax.set_title(title)
    fig.colorbar(im, ax=ax, label="examples")
    save_figure(fig, path)


def plot_per_class(per_class: dict, title: str, path: Path) -> None:
    plt = pyplot()
    names = sorted(per_class)
    x = np.arange(len(names))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.3 * len(names) + 2), 3.8))
    for j, key in enumerate(("precision", "recall", "f1")):
        ax.bar(x + (j - 1) * 0.27, [per_class[n][key] for n in names], 0.27, label=key)
    ax.set_xticks(x, [f"{n}\n({per_class[n]['support']:,} entities)" for n in names])
    ax.set_xlabel("entity class (gold entities in brackets)")
    ax.set_ylabel("score")
    ax.set_ylim(0, 1.05)
    ax.legend(loc="lower right")
    ax.grid(axis="y", alpha=0.3)
    ax.set_title(title)
    save_figure(fig, path)


def plot_regression(y_true, y_pred, title: str, path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(4.5, 4.5))
    ax.scatter(y_true, y_pred, s=6, alpha=0.5)
    lo, hi = min(min(y_true), min(y_pred)), max(max(y_true), max(y_pred))
    ax.plot([lo, hi], [lo, hi], color="gray", lw=1, ls="--", label="perfect")
    ax.set_xlabel("true value")
    ax.set_ylabel("predicted value")
    ax.legend()
    ax.set_title(title)
    save_figure(fig, path)


