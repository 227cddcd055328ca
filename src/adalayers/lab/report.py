"""`adalayers report RUN_DIR`: a run folder -> report.md + PNG figures + report.json.

The figures: learned layer weights (bars), layer weights per epoch, training curves, and per task
kind a confusion matrix (classification), per-class precision/recall/F1 (token tasks) or a scatter
of predicted vs true values (regression). The head is run again on the chosen split to get
predictions, so the report can list the most confident wrong ones with their text.
"""
from __future__ import annotations

import json
from pathlib import Path

from adalayers.store import run as runlib
from adalayers.lab.figures import (plot_confusion, plot_layer_history, plot_layer_weights, plot_per_class,
                                plot_regression, plot_training_curves)
from adalayers.errors import DataError, RunError
from adalayers.kinds import TaskKind


# --- reading the run folder -----------------------------------------------------------------

def read_log(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "log.jsonl"
    if not path.is_file():
        return []
    entries = []
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if line.strip():
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise RunError(f"{path}:{n}: not valid JSON ({e.msg})") from None
    return entries


def read_metrics(run_dir: Path) -> dict:
    path = Path(run_dir) / "metrics.json"
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise RunError(f"{path}: not valid JSON ({e.msg})") from None


def parameters_used(metrics: dict, meta: dict) -> int | None:
    """Trainable parameters the run really uses: the projections of layers with weight 0 never run."""
    weights, total = metrics.get("layer_weights"), metrics.get("trainable_params")
    if weights is None or total is None:
        return None
    k, d = meta["config"]["mixer"]["k"], meta["base"]["hidden_size"]
    return total - sum(1 for w in weights if w == 0) * k * d


# --- predictions ------------------------------------------------------------------------------

def _clip(text: str, n: int = 400) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= n else text[: n - 1] + "…"


def wrong_sequence(examples, preds, labels, top: int) -> list[dict]:
    wrong = []
    for e, (idx, probs) in zip(examples, preds):
        if labels[idx] != e.label:
            text = e.text if e.text_pair is None else f"{e.text} ||| {e.text_pair}"
            wrong.append({"text": text, "true": e.label, "predicted": labels[idx], "confidence": probs[idx]})
    return sorted(wrong, key=lambda r: -r["confidence"])[:top]


def wrong_words(examples, split, outs, labels, top: int, context: int = 8) -> list[dict]:
    from adalayers.recipes.evaluate import word_outputs

    wrong = []
    for i, w, probs in word_outputs(split, outs):
        j = int(probs.argmax())
        gold = examples[i].tags[w]
        if labels[j] != gold:
            wrong.append((float(probs[j]), i, w, labels[j], gold))
    wrong.sort(key=lambda r: -r[0])
    out = []
    for conf, i, w, pred, gold in wrong[:top]:
        words = examples[i].words
        a, b = max(0, w - context), min(len(words), w + context + 1)
        shown = ["…"] * (a > 0) + words[a:w] + [f"[{words[w]}]"] + words[w + 1:b] + ["…"] * (b < len(words))
        out.append({"word": words[w], "sentence": " ".join(shown), "true": gold, "predicted": pred,
                    "confidence": conf, "example": i})
    return out


def wrong_values(examples, preds, top: int) -> list[dict]:
    rows = [{"text": f"{e.text} ||| {e.text_pair}" if e.text_pair else e.text, "true": e.label,
             "predicted": p, "error": abs(p - e.label)} for e, p in zip(examples, preds)]
    return sorted(rows, key=lambda r: -r["error"])[:top]


# --- the report -------------------------------------------------------------------------------

def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4f}"
    if isinstance(v, int):
        return f"{v:,}"
    return str(v)


def build(run_dir: Path, split: str = "test", top: int = 10) -> dict:
    """Write report.md, the figures and report.json into run_dir; returns report.json's content."""
    from adalayers.cli import recipes
    from adalayers.recipes.evaluate import example_predictions, row_outputs, score
    from adalayers.model.mixer import AdaLayersMixer
    from adalayers.model.precision import autocast_for

    run_dir = Path(run_dir)
    _, cfg, meta = runlib.load_head(run_dir)
    backbone, data, encoded = recipes.prepare(cfg)
    task, _, _ = runlib.load_head(run_dir, backbone)
    task.to(backbone.device)
    if split not in encoded:
        raise DataError(f"task {data.name} has no {split} split")
    metrics, log = read_metrics(run_dir), read_log(run_dir)
    kind, labels, main = task.kind, task.labels, meta.get("main_metric") or data.main_metric
    base = meta["base"]
    title = f"{data.name} on {base['name']}"

    # predictions on the split, from the saved head
    source = recipes.make_source(cfg, backbone, data, encoded)
    pad_id = backbone.tokenizer.pad_token_id or 0
    outs = row_outputs(task, source, encoded[split], cfg.train.eval_batch_size, pad_id,
                       autocast_for(cfg.train.precision, backbone.device))
    examples = data.splits[split]
    preds = example_predictions(task, encoded[split], outs, examples)
    scores = score(task, examples, preds)

    figures, md = {}, []
    weights = [float(w) for w in task.mixer.layer_weights().tolist()]
    used = [i for i, w in enumerate(weights) if w > 0]
    figures["layer_weights"] = "layer_weights.png"
    plot_layer_weights(weights, f"{title}: learned layer weights", run_dir / figures["layer_weights"])
    if log and all("layer_weights" in e for e in log):
        init = AdaLayersMixer(base["num_layers"], base["hidden_size"], cfg.mixer).layer_weights().tolist()
        history = [(0, init)] + [(e["epoch"], e["layer_weights"]) for e in log]
        figures["layer_history"] = "layer_history.png"
        plot_layer_history(history, f"{title}: layer weights during training", run_dir / figures["layer_history"])
    if log:
        figures["training_curves"] = "training_curves.png"
        plot_training_curves(log, main, f"{title}: training", run_dir / figures["training_curves"])

    # --- header and summary
    n_params, base_params = metrics.get("trainable_params", task.num_trainable()), backbone.num_parameters()
    p_used = parameters_used({"layer_weights": weights, "trainable_params": n_params}, meta)
    md += [f"# Report: {title}", "",
           f"Run folder `{run_dir}`. A frozen `{base['name']}` ({base['num_layers'] - 1} transformer layers + "
           f"embedding output, hidden size {base['hidden_size']}) feeds an AdaLayers mixer (k = {cfg.mixer.k}) "
           f"and a {kind} head. All numbers below are on the **{split}** split unless marked.", "",
           "## Summary", "", "| quantity | value |", "|---|---|"]
    for key in _main_keys(kind, main):
        if key in scores:
            md.append(f"| {split} {key} | {_fmt(scores[key])} |")
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

    # --- data
    md += ["", "## Data", ""]
    md += [f"- {note}" for note in data.notes]
    md.append("- examples: " + ", ".join(f"{name} {len(ex):,}" for name, ex in data.splits.items()))
    if cfg.task.max_train_examples or cfg.task.max_eval_examples:
        md.append(f"- **subsets**: only the first {cfg.task.max_train_examples or 'all'} training and "
                  f"{cfg.task.max_eval_examples or 'all'} validation/test examples were used "
                  f"(task.max_train_examples / max_eval_examples)")
    truncation = {}
    for name, enc in encoded.items():
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

    # --- layers
    md += ["", "## Layer weights", "",
           "Each layer's hidden state is projected to k dimensions and normalised; the mixer adds them with "
           f"these weights (softmax(alpha·p) with alpha = {cfg.mixer.alpha:g}; weights at or below the cutoff "
           f"{cfg.mixer.cutoff:g} are set to 0). Layer 0 is the embedding output.", "",
           f"![learned layer weights]({figures['layer_weights']})", "",
           "| layer | " + " | ".join(str(i) for i in range(len(weights))) + " |",
           "|---" * (len(weights) + 1) + "|",
           "| weight | " + " | ".join(f"{w:.3f}" for w in weights) + " |"]
    if "layer_history" in figures:
        md += ["", "How the weights moved during training (epoch 0 is the initialisation):", "",
               f"![layer weights per epoch]({figures['layer_history']})"]
    if "training_curves" in figures:
        md += ["", "## Training", "", f"Mean training loss and validation {main} per epoch; the saved head "
               f"is the one of the best validation epoch.", "", f"![training curves]({figures['training_curves']})"]

    # --- per kind
    wrong: list[dict] = []
    if kind == TaskKind.CLASSIFICATION:
        from sklearn.metrics import confusion_matrix

        label_id = {name: i for i, name in enumerate(labels)}
        cm = confusion_matrix([label_id[e.label] for e in examples], [p[0] for p in preds],
                              labels=list(range(len(labels))))
        figures["confusion_matrix"] = "confusion_matrix.png"
        plot_confusion(cm, labels, f"{title}: confusion matrix ({split})", run_dir / figures["confusion_matrix"])
        md += ["", "## Confusion matrix", "", "Rows: true label; columns: predicted label.", "",
               "| true \\ predicted | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]
        md += [f"| {labels[i]} | " + " | ".join(f"{cm[i, j]:,}" for j in range(len(labels))) + " |"
               for i in range(len(labels))]
        md += ["", f"![confusion matrix]({figures['confusion_matrix']})"]
        scores["confusion_matrix"] = cm.tolist()
        wrong = wrong_sequence(examples, preds, labels, top)
        md += ["", f"## The {len(wrong)} most confident wrong predictions", ""]
        md += [f"{n}. predicted **{r['predicted']}** with probability {r['confidence']:.3f}, true "
               f"**{r['true']}**: “{_clip(r['text'])}”" for n, r in enumerate(wrong, 1)]
    elif kind == TaskKind.TOKENS:
        pc = scores["per_class"]
        figures["per_class"] = "per_class.png"
        plot_per_class(pc, f"{title}: entity scores per class ({split})", run_dir / figures["per_class"])
        md += ["", "## Per-class scores", "", "Entity level (an entity counts only with its exact span and class); "
               "count = entities of that class in the gold annotation.", "",
               "| class | precision | recall | F1 | count |", "|---|---|---|---|---|"]
        md += [f"| {n} | {v['precision']:.4f} | {v['recall']:.4f} | {v['f1']:.4f} | {v['support']:,} |"
               for n, v in sorted(pc.items())]
        md.append(f"| **micro average** | {scores['precision']:.4f} | {scores['recall']:.4f} | "
                  f"{scores['f1']:.4f} | {sum(v['support'] for v in pc.values()):,} |")
        md += ["", f"![per-class scores]({figures['per_class']})"]
        wrong = wrong_words(examples, encoded[split], outs, labels, top)
        md += ["", f"## The {len(wrong)} most confident wrong word tags", "",
               "The word in [brackets] got the predicted tag; a few words of context on each side.", "",
               "| # | word in context | predicted | true | probability |", "|---|---|---|---|---|"]
        md += [f"| {n} | {_clip(r['sentence'])} | {r['predicted']} | {r['true']} | {r['confidence']:.3f} |"
               for n, r in enumerate(wrong, 1)]
    else:
        figures["predictions"] = "predictions.png"
        plot_regression([e.label for e in examples], preds, f"{title}: predicted vs true ({split})",
                        run_dir / figures["predictions"])
        md += ["", "## Predictions", "", f"![predicted vs true]({figures['predictions']})"]
        wrong = wrong_values(examples, preds, top)
        md += ["", f"## The {len(wrong)} largest errors", ""]
        md += [f"{n}. predicted {r['predicted']:.2f}, true {r['true']:.2f}: “{_clip(r['text'])}”"
               for n, r in enumerate(wrong, 1)]

    # --- settings
    md += ["", "## Settings", "", "```json", json.dumps({k: cfg.to_dict()[k] for k in ("task", "model", "mixer", "head",
                                                                                       "train")}, indent=1), "```", ""]
    report = {"run": str(run_dir), "task": data.name, "base": base["name"], "split": split, "scores": scores,
              "layer_weights": weights, "used_layers": used, "trainable_params": n_params,
              "params_used": p_used, "base_params": base_params, "truncation": truncation,
              "train_seconds": metrics.get("train_seconds"), "best_epoch": metrics.get("best_epoch"),
              "figures": figures, "most_confident_wrong": wrong}
    runlib.atomic_write(run_dir / "report.md", "\n".join(md))
    runlib.write_json(run_dir / "report.json", report)
    return report


def duration(seconds: float) -> str:
    return f"{seconds:.1f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


def _main_keys(kind: str, main: str) -> list[str]:
    keys = {TaskKind.CLASSIFICATION: ["accuracy", "mcc", "macro_f1"], TaskKind.TOKENS: ["f1", "precision", "recall"],
            TaskKind.REGRESSION: ["pearson", "spearman", "mse"]}[kind]
    return [main] + [k for k in keys if k != main]


def add_commands(sub) -> None:
    p = sub.add_parser("report", help="write report.md and figures (layer weights, curves, errors) for a run")
    p.add_argument("run", help="run folder from 'adalayers train' (or a --seeds folder: every seed's report and "
                               "a median (min–max) table)")
    p.add_argument("--split", default="test", choices=["validation", "test"], help="split to predict and score")
    p.add_argument("--top", type=int, default=10, help="how many confident wrong predictions to list")
    p.set_defaults(fn=_cmd_report)


def build_seeds(folder: Path, split: str = "test", top: int = 10) -> list[Path]:
    """A `train --seeds` folder: every seed's report, and folder/report.md with the median (min–max) table."""
    from adalayers.lab.seeds import table

    folder = Path(folder)
    summary = read_metrics(folder)
    runs = [folder / r for r in summary["runs"]] + ([folder / "ensemble"] if summary.get("ensemble") else [])
    for r in runs:
        build(r, split, top)
    links = ", ".join(f"[{r.name}]({r.name}/report.md)" for r in runs)
    runlib.atomic_write(folder / "report.md", table(summary) + f"\nReports of each run: {links}.\n")
    return runs


def _cmd_report(args) -> int:
    if not (Path(args.run) / "config.json").is_file() and "spread" in read_metrics(Path(args.run)):
        runs = build_seeds(Path(args.run), args.split, args.top)
        print(f"wrote {Path(args.run) / 'report.md'} and the reports of {', '.join(r.name for r in runs)}")
        return 0
    from adalayers.store.hub import resolve_run

    args.run = resolve_run(args.run)
    report = build(Path(args.run), args.split, args.top)
    print(f"wrote {Path(args.run) / 'report.md'} and {', '.join(report['figures'].values())}")
    return 0
