"""GLUE tasks from their TSV files: CoLA and STS-B.

CoLA: train.tsv/dev.tsv without header: source, label (0/1), original label, sentence.
      Validation = stratified 10% of train (seed 42); test = GLUE dev (test has no labels).
STS-B: 10-column TSVs with header (sentence1, sentence2, score 0-5).
      Validation = 10% of train; test = GLUE dev.
"""
from __future__ import annotations

import math
from pathlib import Path

from adalayers.errors import DataError
from adalayers.data.tasks.base import Example, TaskData, bad_row, read_lines, register, stratified_split
from adalayers.kinds import TaskKind

COLA_LABELS = ["unacceptable", "acceptable"]


def _cola_rows(path: Path) -> list[Example]:
    rows = []
    for n, line in enumerate(read_lines(path), start=1):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) != 4:
            bad_row(f"{path}:{n}: expected 4 tab-separated columns (source, label, original label, "
                    f"sentence), got {len(cols)}")
        elif cols[1] not in ("0", "1"):
            bad_row(f"{path}:{n}: label must be 0 or 1, got {cols[1]!r}")
        elif not cols[3].strip():
            bad_row(f"{path}:{n}: empty sentence")
        else:
            rows.append(Example(text=cols[3].strip(), label=COLA_LABELS[int(cols[1])]))
    return rows


def _glue_splits(cfg, folder: Path, read_rows) -> dict:
    """GLUE's test labels are hidden: validation is held out of train.tsv, dev.tsv is the test set."""
    train, validation = stratified_split(read_rows(folder / "train.tsv"),
                                         cfg.task.validation_fraction, cfg.task.split_seed)
    return {"train": train, "validation": validation, "test": read_rows(folder / "dev.tsv")}


def _glue_note(cfg, splits: dict) -> str:
    how = "stratified " if all(isinstance(e.label, str) for e in splits["train"]) else ""
    return (f"validation = {how}{cfg.task.validation_fraction:.0%} of train (seed {cfg.task.split_seed}); "
            f"test = GLUE dev ({len(splits['test'])} rows)")


@register("cola")
def cola(cfg) -> TaskData:
    folder = cfg.data_dir() / "glue" / "CoLA"
    splits = _glue_splits(cfg, folder, _cola_rows)
    return TaskData("cola", TaskKind.CLASSIFICATION, COLA_LABELS, splits, main_metric="mcc",
                    files=[folder / "train.tsv", folder / "dev.tsv"], notes=[_glue_note(cfg, splits)])


def _stsb_rows(path: Path) -> list[Example]:
    lines = read_lines(path)
    if not lines:
        raise DataError(f"{path}: empty file")
    header = lines[0].split("\t")
    try:
        i1, i2, iscore = header.index("sentence1"), header.index("sentence2"), header.index("score")
    except ValueError:
        raise DataError(f"{path}:1: header must name sentence1, sentence2 and score; got {header}") from None
    rows = []
    for n, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        cols = line.split("\t")
        if len(cols) != len(header):
            bad_row(f"{path}:{n}: expected {len(header)} columns, got {len(cols)}")
            continue
        try:
            score = float(cols[iscore])
        except ValueError:
            score = math.nan
        if not math.isfinite(score):
            bad_row(f"{path}:{n}: score is not a finite number: {cols[iscore]!r}")
            continue
        rows.append(Example(text=cols[i1], text_pair=cols[i2], label=score))
    return rows


@register("stsb", pairs=True)
def stsb(cfg) -> TaskData:
    folder = cfg.data_dir() / "glue" / "STS-B"
    splits = _glue_splits(cfg, folder, _stsb_rows)
    return TaskData("stsb", TaskKind.REGRESSION, [], splits, main_metric="pearson",
                    files=[folder / "train.tsv", folder / "dev.tsv"], notes=[_glue_note(cfg, splits)])
