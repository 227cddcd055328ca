"""Which model a run keeps: the trained head or the best linear probe (train.keep: head, probe or best).

best, on the validation main metric:
    validation of SMALL_VALIDATION rows or more   the higher score is kept; a tie goes to the probe (the
                                                  simpler and cheaper model)
    fewer rows                                    a paired bootstrap over the validation rows (BOOTSTRAP
                                                  resamples, train.seed): the head is kept only when it scores
                                                  higher in at least HEAD_SHARE of them, else the probe. On a
                                                  few hundred rows a difference of one or two examples decides
                                                  the plain comparison, and both scores were chosen on these
                                                  rows (the head's best epoch, the probe's layer, pooling and
                                                  regularisation): the simpler model is kept unless the head's
                                                  lead holds over most resamples.
The kept model's files are the run folder's (config.json, head.safetensors); the other's go to
candidates/head/ or candidates/probe/, each a run folder of its own with its checksums. selection.json and
selection.md say which was kept and why.
"""
from __future__ import annotations

import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from adalayers.files import atomic_write, write_json
from adalayers.recipes.evaluate import score
from adalayers.store import run as runlib

SMALL_VALIDATION = 1_000
BOOTSTRAP = 200
HEAD_SHARE = 0.75
CANDIDATES = "candidates"
RUN_FILES = (runlib.HEAD, runlib.CONFIG)


@dataclass
class Choice:
    kept: str              # "head" or "probe"
    why: str
    head_validation: float
    probe_validation: float
    head_share: float | None = None   # bootstrap: share of resamples the head scored higher in
    validation_rows: int = 0


def choose(keep: str, main: str, task, examples: list, head_preds: list, probe_preds: list, head_val: float,
           probe_val: float, seed: int) -> Choice:
    """The kept model by train.keep (see the module's docstring for best)."""
    n = len(examples)
    base = dict(head_validation=head_val, probe_validation=probe_val, validation_rows=n)
    if keep in ("head", "probe"):
        return Choice(keep, f"train.keep is {keep}", **base)
    if n >= SMALL_VALIDATION:
        kept = "head" if head_val > probe_val else "probe"
        return Choice(kept, f"the higher validation {main} on {n:,} rows (head {head_val:.4f}, probe {probe_val:.4f}"
                            f"{'; a tie goes to the probe' if head_val == probe_val else ''})", **base)
    share = head_share(main, task, examples, head_preds, probe_preds, seed)
    kept = "head" if share >= HEAD_SHARE else "probe"
    return Choice(kept, f"validation has {n:,} rows (< {SMALL_VALIDATION:,}): the head scored a higher validation "
                        f"{main} in {100 * share:.0f}% of {BOOTSTRAP} paired bootstrap resamples of them (head "
                        f"{head_val:.4f}, probe {probe_val:.4f} on all); the head is kept only at "
                        f"{100 * HEAD_SHARE:.0f}% or more", head_share=share, **base)


def head_share(main: str, task, examples: list, head_preds: list, probe_preds: list, seed: int) -> float:
    """Share of paired bootstrap resamples of the validation rows in which the head's main metric is higher
    than the probe's (a tie counts half)."""
    rng = np.random.default_rng(seed)
    n, wins = len(examples), 0.0
    metric = resample_metric(main, task, examples, head_preds, probe_preds)
    for _ in range(BOOTSTRAP):
        idx = rng.integers(0, n, n)
        h, p = (float(np.nan_to_num(metric(idx, which))) for which in (0, 1))
        wins += 1.0 if h > p else 0.5 if h == p else 0.0
    return wins / BOOTSTRAP


def resample_metric(main: str, task, examples: list, head_preds: list, probe_preds: list):
    """metric(idx, which): the main metric of the head's (which 0) or the probe's (1) predictions on the rows
    idx. Classification: the one sklearn function of metrics.classification that gives it (the full report
    costs tens of milliseconds a call); other kinds: recipes.evaluate.score."""
    from sklearn.metrics import f1_score, matthews_corrcoef

    from adalayers.kinds import TaskKind

    if task.kind == TaskKind.CLASSIFICATION and main in ("accuracy", "mcc", "macro_f1"):
        ids = {name: i for i, name in enumerate(task.labels)}
        y = np.array([ids[e.label] for e in examples])
        preds = [np.array([p[0] for p in head_preds]), np.array([p[0] for p in probe_preds])]
        every = list(range(len(task.labels)))
        fn = {"accuracy": lambda t, q: float(np.mean(t == q)), "mcc": matthews_corrcoef,
              "macro_f1": lambda t, q: f1_score(t, q, average="macro", labels=every, zero_division=0)}[main]
        return lambda idx, which: fn(y[idx], preds[which][idx])
    both = (head_preds, probe_preds)
    return lambda idx, which: score(task, [examples[i] for i in idx], [both[which][i] for i in idx]).get(main, 0.0)


def move_run_files(src: Path, dst: Path) -> None:
    """config.json and head.safetensors of run folder `src` into `dst` (created), head first."""
    dst.mkdir(parents=True, exist_ok=True)
    for name in RUN_FILES:
        tmp = dst / f".{name}.tmp"
        shutil.copy2(src / name, tmp)
        tmp.replace(dst / name)


def table(choice: Choice, main: str, head: dict, probe: dict, command: str = "") -> str:
    """selection.md: both models' validation and test scores, which was kept and why."""
    def cell(d: dict, split: str) -> str:
        v = d.get(split, {}).get(main)
        return "-" if v is None else f"{v:.4f}"

    lines = ([f"Command: `{command}`", ""] if command else []) + [
        f"| model | validation {main} | test {main} |", "|---|---:|---:|",
        f"| head{' **(kept)**' if choice.kept == 'head' else ''} | {cell(head, 'validation')} | {cell(head, 'test')} |",
        f"| linear probe (layer {probe['layer']}, {probe['pooling']} pooling, regularisation {probe['regularisation']:g})"
        f"{' **(kept)**' if choice.kept == 'probe' else ''} | {cell(probe, 'validation')} | {cell(probe, 'test')} |",
        "", f"Kept: the {choice.kept}: {choice.why}. Test never takes part in the choice.", ""]
    return "\n".join(lines)


def write_selection(out: Path, choice: Choice, main: str, head: dict, probe: dict) -> None:
    write_json(out / "selection.json", {"kept": choice.kept, "metric": main, "choice": asdict(choice),
                                        "head": head, "probe": probe})
    atomic_write(out / "selection.md", table(choice, main, head, probe))


def probe_and_keep(cfg, out: Path, backbone, data, encoded: dict, source, pad_id: int, task, results: dict,
                   preds: dict, autocast, write: bool) -> dict:
    """Fit the linear probes on the run's states, score the best one as a probe head, keep the better model
    (train.keep) in `out` (with `write`: rank 0); returns what metrics.json adds: "probe", "head" and "kept",
    and the kept model's "validation" and "test"."""
    from adalayers.recipes.evaluate import evaluate_split
    from adalayers.recipes.probes import fit_probes

    fit = fit_probes(cfg, backbone, data, encoded, source, pad_id)
    head = {s: results[s] for s in ("validation", "test") if s in results}
    if fit is None:
        return {"head": head, "kept": "head", "probe": None}
    probe, probe_preds = fit.summary(), {}
    for split in ("validation", "test"):
        if split in encoded:
            probe[split], probe_preds[split] = evaluate_split(fit.task, source, encoded[split], data.splits[split],
                                                              cfg.train.eval_batch_size, pad_id, autocast)
    main = data.main_metric
    choice = choose(cfg.train.keep, main, task, data.splits["validation"], preds["validation"],
                    probe_preds["validation"], float(results["validation"][main]),
                    float(probe["validation"][main]), cfg.train.seed)
    probe["validation_rows"] = choice.validation_rows
    if write:
        probe_dir = out / CANDIDATES / "probe"
        probe_dir.mkdir(parents=True, exist_ok=True)
        sha = runlib.save_head(probe_dir, fit.task)
        runlib.save_config(probe_dir, fit.task.cfg, data.labels, backbone, sha, task=data.name, kind=str(data.kind),
                           main_metric=main)
        runlib.write_json(probe_dir / "metrics.json", {s: probe[s] for s in ("validation", "test") if s in probe})
        if choice.kept == "probe":
            move_run_files(out, out / CANDIDATES / "head")
            move_run_files(probe_dir, out)
        write_selection(out, choice, main, head, probe)
    kept = probe if choice.kept == "probe" else head
    return {"head": head, "probe": probe, "kept": choice.kept, "kept_why": choice.why,
            **{s: kept[s] for s in ("validation", "test") if s in kept}}
