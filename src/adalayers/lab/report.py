"""`adalayers report RUN_DIR`: a run folder -> report.md + PNG figures + report.json.

The figures: learned layer weights (bars), layer weights per epoch, training curves, and per task
kind a confusion matrix (classification), per-class precision/recall/F1 (token tasks) or a scatter
of predicted vs true values (regression). The head is run again on the chosen split to get
predictions, so the report can list the most confident wrong ones with their text.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from adalayers.store import run as runlib
from adalayers.lab import report_sections as sections
from adalayers.errors import DataError
from adalayers.kinds import TaskKind
from adalayers.lab.runs import parameters_used, read_metrics


# --- predictions ------------------------------------------------------------------------------

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

@dataclass
class Scored:
    """A saved head run again on one split: what every section of the report reads."""
    run_dir: Path
    split: str
    cfg: object
    meta: dict
    backbone: object
    data: object
    encoded: dict
    task: object
    outs: list
    preds: list
    scores: dict
    metrics: dict
    log: list[dict]

    @property
    def examples(self) -> list:
        return self.data.splits[self.split]

    @property
    def main(self) -> str:
        return self.meta.get("main_metric") or self.data.main_metric

    @property
    def title(self) -> str:
        return f"{self.data.name} on {self.meta['base']['name']}"


def score_split(run_dir: Path, split: str) -> Scored:
    """Load the run's head and base, predict the split and score it."""
    from adalayers.recipes import service
    from adalayers.recipes.evaluate import example_predictions, row_outputs, score
    from adalayers.model.precision import autocast_for

    run_dir = Path(run_dir)
    _, cfg, meta = runlib.load_head(run_dir)
    backbone, data, encoded = service.prepare(cfg)
    task, _, _ = runlib.load_head(run_dir, backbone)
    task.to(backbone.device)
    if split not in encoded:
        raise DataError(f"task {data.name} has no {split} split")
    source = service.make_source(cfg, backbone, data, encoded)
    outs = row_outputs(task, source, encoded[split], cfg.train.eval_batch_size, backbone.tokenizer.pad_token_id or 0,
                       autocast_for(cfg.train.precision, backbone.device))
    examples = data.splits[split]
    preds = example_predictions(task, encoded[split], outs, examples)
    return Scored(run_dir, split, cfg, meta, backbone, data, encoded, task, outs, preds,
                  score(task, examples, preds), read_metrics(run_dir), runlib.read_log(run_dir))


def build(run_dir: Path, split: str = "test", top: int = 10) -> dict:
    """Write report.md, the figures and report.json into run_dir; returns report.json's content."""
    r = score_split(run_dir, split)
    run_dir = r.run_dir
    figures, weights = sections.layer_figures(r)
    used = [i for i, w in enumerate(weights) if w > 0]
    n_params, base_params = r.metrics.get("trainable_params", r.task.num_trainable()), r.backbone.num_parameters()
    p_used = parameters_used({"layer_weights": weights, "trainable_params": n_params}, r.meta)
    md = sections.summary(r, used, n_params, p_used, base_params)
    data_md, truncation = sections.data(r)
    md += data_md + sections.layers(r, figures, weights)
    if r.task.kind == TaskKind.CLASSIFICATION:
        kind_md, wrong = sections.confusion(r, figures, wrong_sequence(r.examples, r.preds, r.task.labels, top))
    elif r.task.kind == TaskKind.TOKENS:
        kind_md, wrong = sections.per_class(r, figures, wrong_words(r.examples, r.encoded[split], r.outs,
                                                                     r.task.labels, top))
    else:
        kind_md, wrong = sections.values(r, figures, wrong_values(r.examples, r.preds, top))
    md += kind_md + sections.settings(r)
    report = {"run": str(run_dir), "task": r.data.name, "base": r.meta["base"]["name"], "split": split,
              "scores": r.scores, "layer_weights": weights, "used_layers": used, "trainable_params": n_params,
              "params_used": p_used, "base_params": base_params, "truncation": truncation,
              "train_seconds": r.metrics.get("train_seconds"), "best_epoch": r.metrics.get("best_epoch"),
              "figures": figures, "most_confident_wrong": wrong}
    runlib.atomic_write(run_dir / "report.md", "\n".join(md))
    runlib.write_json(run_dir / "report.json", report)
    return report


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
