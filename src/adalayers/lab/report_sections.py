"""The sections of report.md (adalayers.lab.report): each reads a Scored split and returns its Markdown lines,
writing its figures into the run folder."""
from __future__ import annotations

import json

from adalayers.kinds import TaskKind
from adalayers.lab.figures import (plot_confusion, plot_layer_history, plot_layer_weights, plot_per_class,
                                   plot_regression, plot_training_curves)
from adalayers.lab.runs import duration


def _clip(text: str, n: int = 400) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= n else text[: n - 1] + "…"


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def _main_keys(kind: str, main: str) -> list[str]:
    keys = {TaskKind.CLASSIFICATION: ["accuracy", "mcc", "macro_f1"], TaskKind.TOKENS: ["f1", "precision", "recall"],
            TaskKind.REGRESSION: ["pearson", "spearman", "mse"]}[kind]
    return [main] + [k for k in keys if k != main]


def layer_figures(r) -> tuple[dict, list[float]]:
    """The learned layer weights, their history over the epochs and the training curves: {name: file}, weights."""
    from adalayers.model.mixer import AdaLayersMixer

    figures, base = {}, r.meta["base"]
    weights = [float(w) for w in r.task.mixer.layer_weights().tolist()]
    figures["layer_weights"] = "layer_weights.png"
    plot_layer_weights(weights, f"{r.title}: learned layer weights", r.run_dir / figures["layer_weights"])
    if r.log and all("layer_weights" in e for e in r.log):
        init = AdaLayersMixer(base["num_layers"], base["hidden_size"], r.cfg.mixer).layer_weights().tolist()
        history = [(0, init)] + [(e["epoch"], e["layer_weights"]) for e in r.log]
        figures["layer_history"] = "layer_history.png"
        plot_layer_history(history, f"{r.title}: layer weights during training", r.run_dir / figures["layer_history"])
    if r.log:
        figures["training_curves"] = "training_curves.png"
        plot_training_curves(r.log, r.main, f"{r.title}: training", r.run_dir / figures["training_curves"])
    return figures, weights


def summary(r, used: list[int], n_params: int, p_used: int | None, base_params: int) -> list[str]:
    cfg, base, metrics, main, split = r.cfg, r.meta["base"], r.metrics, r.main, r.split
    md = [f"# Report: {r.title}", "",
          f"Run folder `{r.run_dir}`. A frozen `{base['name']}` ({base['num_layers'] - 1} transformer layers + "
          f"embedding output, hidden size {base['hidden_size']}) feeds an AdaLayers mixer (k = {cfg.mixer.k}) "
          f"and a {r.task.kind} head. All numbers below are on the **{split}** split unless marked.", "",
          "## Summary", "", "| quantity | value |", "|---|---|"]
    md += [f"| {split} {key} | {_fmt(r.scores[key])} |" for key in _main_keys(r.task.kind, main) if key in r.scores]
    if metrics.get("validation", {}).get(main) is not None:
        md.append(f"| validation {main} (best epoch) | {_fmt(metrics['validation'][main])} |")
    if metrics.get("best_epoch") is not None:
        md.append(f"| best epoch / epochs trained | {metrics['best_epoch']} / {metrics.get('epochs', '?')} |")
    if metrics.get("train_seconds") is not None:
        md.append(f"| training time | {duration(metrics['train_seconds'])} |")
    md.append(f"| trainable parameters | {n_params:,} ({100 * n_params / base_params:.2f}% of the base's "
              f"{base_params:,}) |")
    if p_used is not None and p_used != n_params:
        md.append(f"| of these used at inference | {p_used:,} ({100 * p_used / base_params:.2f}% of the base; "
                  f"projections of layers with weight 0 never run) |")
    md.append(f"| layers used (weight > 0) | {', '.join(map(str, used))} |")
    if cfg.mixer.pin_layer is not None:
        md.append(f"| single-layer baseline | pinned to layer {cfg.mixer.pin_layer} |")
    return md


def data(r) -> tuple[list[str], dict]:
    """The data section, and per split how many examples were truncated (or split into windows)."""
    cfg, kind = r.cfg, r.task.kind
    md = ["", "## Data", ""] + [f"- {note}" for note in r.data.notes]
    md.append("- examples: " + ", ".join(f"{name} {len(ex):,}" for name, ex in r.data.splits.items()))
    if cfg.task.max_train_examples or cfg.task.max_eval_examples:
        md.append(f"- **subsets**: only the first {cfg.task.max_train_examples or 'all'} training and "
                  f"{cfg.task.max_eval_examples or 'all'} validation/test examples were used "
                  f"(task.max_train_examples / max_eval_examples)")
    truncation = {}
    for name, enc in r.encoded.items():
        if kind == TaskKind.TOKENS:
            truncation[name] = {"examples": enc.num_examples, "split_into_windows": enc.extra.get("split_examples", 0),
                                "windows": enc.extra.get("windows", len(enc.rows))}
        else:
            truncation[name] = {"examples": enc.num_examples, "truncated": enc.num_truncated,
                                "fraction": enc.num_truncated / max(1, enc.num_examples)}
    if kind == TaskKind.TOKENS:
        md.append(f"- sentences longer than max_length = {cfg.model.max_length} sub-tokens are split into "
                  f"windows (never cut): " + ", ".join(
                      f"{k} {v['split_into_windows']:,} of {v['examples']:,}" for k, v in truncation.items()))
    else:
        md.append(f"- texts truncated at max_length = {cfg.model.max_length} tokens: " + ", ".join(
            f"{k} {v['truncated']:,} of {v['examples']:,} ({100 * v['fraction']:.1f}%)" for k, v in truncation.items()))
    return md, truncation


def layers(r, figures: dict, weights: list[float]) -> list[str]:
    mixer = r.cfg.mixer
    md = ["", "## Layer weights", "",
          "Each layer's hidden state is projected to k dimensions and normalised; the mixer adds them with "
          f"these weights (softmax(alpha·p) with alpha = {mixer.alpha:g}; weights at or below the cutoff "
          f"{mixer.cutoff:g} are set to 0). Layer 0 is the embedding output.", "",
          f"![learned layer weights]({figures['layer_weights']})", "",
          "| layer | " + " | ".join(str(i) for i in range(len(weights))) + " |",
          "|---" * (len(weights) + 1) + "|",
          "| weight | " + " | ".join(f"{w:.3f}" for w in weights) + " |"]
    if "layer_history" in figures:
        md += ["", "How the weights moved during training (epoch 0 is the initialisation):", "",
               f"![layer weights per epoch]({figures['layer_history']})"]
    if "training_curves" in figures:
        md += ["", "## Training", "", f"Mean training loss and validation {r.main} per epoch; the saved head "
               f"is the one of the best validation epoch.", "", f"![training curves]({figures['training_curves']})"]
    return md


def confusion(r, figures: dict, wrong: list[dict]) -> tuple[list[str], list[dict]]:
    """Classification: the confusion matrix (also into r.scores) and the most confident wrong predictions."""
    from sklearn.metrics import confusion_matrix

    labels = r.task.labels
    label_id = {name: i for i, name in enumerate(labels)}
    cm = confusion_matrix([label_id[e.label] for e in r.examples], [p[0] for p in r.preds],
                          labels=list(range(len(labels))))
    figures["confusion_matrix"] = "confusion_matrix.png"
    plot_confusion(cm, labels, f"{r.title}: confusion matrix ({r.split})", r.run_dir / figures["confusion_matrix"])
    md = ["", "## Confusion matrix", "", "Rows: true label; columns: predicted label.", "",
          "| true \\ predicted | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
    md += [f"| {labels[i]} | " + " | ".join(f"{cm[i, j]:,}" for j in range(len(labels))) + " |"
           for i in range(len(labels))]
    md += ["", f"![confusion matrix]({figures['confusion_matrix']})"]
    r.scores["confusion_matrix"] = cm.tolist()
    md += ["", f"## The {len(wrong)} most confident wrong predictions", ""]
    md += [f"{n}. predicted **{w['predicted']}** with probability {w['confidence']:.3f}, true "
           f"**{w['true']}**: “{_clip(w['text'])}”" for n, w in enumerate(wrong, 1)]
    return md, wrong


def per_class(r, figures: dict, wrong: list[dict]) -> tuple[list[str], list[dict]]:
    """Token tasks: entity scores per class and the most confident wrong word tags."""
    pc, scores = r.scores["per_class"], r.scores
    figures["per_class"] = "per_class.png"
    plot_per_class(pc, f"{r.title}: entity scores per class ({r.split})", r.run_dir / figures["per_class"])
    md = ["", "## Per-class scores", "", "Entity level (an entity counts only with its exact span and class); "
          "count = entities of that class in the gold annotation.", "",
          "| class | precision | recall | F1 | count |", "|---|---|---|---|---|"]
    md += [f"| {n} | {v['precision']:.4f} | {v['recall']:.4f} | {v['f1']:.4f} | {v['support']:,} |"
           for n, v in sorted(pc.items())]
    md.append(f"| **micro average** | {scores['precision']:.4f} | {scores['recall']:.4f} | "
              f"{scores['f1']:.4f} | {sum(v['support'] for v in pc.values()):,} |")
    md += ["", f"![per-class scores]({figures['per_class']})"]
    md += ["", f"## The {len(wrong)} most confident wrong word tags", "",
           "The word in [brackets] got the predicted tag; a few words of context on each side.", "",
           "| # | word in context | predicted | true | probability |", "|---|---|---|---|---|"]
    md += [f"| {n} | {_clip(w['sentence'])} | {w['predicted']} | {w['true']} | {w['confidence']:.3f} |"
           for n, w in enumerate(wrong, 1)]
    return md, wrong


def values(r, figures: dict, wrong: list[dict]) -> tuple[list[str], list[dict]]:
    """Regression: predicted against true values, and the largest errors."""
    figures["predictions"] = "predictions.png"
    plot_regression([e.label for e in r.examples], r.preds, f"{r.title}: predicted vs true ({r.split})",
                    r.run_dir / figures["predictions"])
    md = ["", "## Predictions", "", f"![predicted vs true]({figures['predictions']})"]
    md += ["", f"## The {len(wrong)} largest errors", ""]
    md += [f"{n}. predicted {w['predicted']:.2f}, true {w['true']:.2f}: “{_clip(w['text'])}”"
           for n, w in enumerate(wrong, 1)]
    return md, wrong


def settings(r) -> list[str]:
    shown = {k: r.cfg.to_dict()[k] for k in ("task", "model", "mixer", "head", "train")}
    return ["", "## Settings", "", "```json", json.dumps(shown, indent=1), "```", ""]
