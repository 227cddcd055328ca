"""IMDB movie reviews (Maas et al. 2011) from the official download.

Reads `imdb/aclImdb_v1.tar.gz` directly (streamed, never unpacked to disk) or an extracted
`imdb/aclImdb/` folder (the folder wins when both exist). Reviews are
`aclImdb/{train,test}/{pos,neg}/<id>_<rating>.txt`; the unsup/ folder is ignored.
Validation = stratified `task.validation_fraction` of train (seed `task.split_seed`); test = the
25,000 test reviews. The HTML line breaks in the reviews (`<br />`) become spaces.

The files come grouped by label; each split is shuffled once with the split seed so that
task.max_train_examples / max_eval_examples take a label-balanced sample, not the first label only.
"""
from __future__ import annotations

import random
import re
import tarfile
from pathlib import Path

from adalayers.errors import DataError
from adalayers.data.tasks.base import Example, TaskData, register, stratified_split
from adalayers.kinds import TaskKind

LABELS = ["negative", "positive"]
_NAME = re.compile(r"(?:^|/)aclImdb/(train|test)/(pos|neg)/(\d+)_(\d+)\.txt$")
_BR = re.compile(r"<br\s*/?>", re.IGNORECASE)


def _decode(raw: bytes, where: str) -> str:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{where}: not valid UTF-8 ({e.reason} at byte {e.start})") from None
    text = " ".join(_BR.sub(" ", text).split())
    if not text:
        raise DataError(f"{where}: empty review")
    return text


def _add(reviews: dict, name: str, raw: bytes, where: str) -> None:
    m = _NAME.search(name)
    if m:
        split, polarity, idx, _rating = m.groups()
        reviews[split].append((polarity, int(idx), _decode(raw, where)))


def _read_tar(path: Path) -> dict:
    reviews = {"train": [], "test": []}
    try:
        with tarfile.open(path, "r:*") as tar:
            for member in tar:  # streams through the archive once
                if member.isfile() and _NAME.search(member.name):
                    _add(reviews, member.name, tar.extractfile(member).read(), f"{path}:{member.name}")
    except (tarfile.TarError, EOFError, OSError) as e:
        raise DataError(f"{path}: not a readable tar.gz archive ({e})") from None
    return reviews


def _read_folder(folder: Path) -> dict:
    reviews = {"train": [], "test": []}
    for file in folder.glob("*/*/*.txt"):
        _add(reviews, file.relative_to(folder.parent).as_posix(), file.read_bytes(), str(file))
    return reviews


def read_imdb(folder: Path) -> tuple[dict[str, list[Example]], Path]:
    """{"train": [...], "test": [...]} of labelled Examples, in a fixed order; and the source read."""
    extracted, archive = folder / "aclImdb", folder / "aclImdb_v1.tar.gz"
    if extracted.is_dir():
        source, reviews = extracted, _read_folder(extracted)
    elif archive.is_file():
        source, reviews = archive, _read_tar(archive)
    else:
        raise DataError(f"IMDB not found: expected {archive} or an extracted {extracted}/ "
                        f"(set task.data_dir or ADALAYERS_DATA)")
    out = {}
    for split, rows in reviews.items():
        kinds = {p for p, _, _ in rows}
        if kinds != {"pos", "neg"}:
            missing = sorted({"pos", "neg"} - kinds)
            raise DataError(f"{source}: no reviews in aclImdb/{split}/{'/, '.join(missing)}/ "
                            f"(expected the official layout aclImdb/{{train,test}}/{{pos,neg}}/<id>_<rating>.txt)")
        rows.sort(key=lambda r: (r[0], r[1]))  # archive order is not numeric: fix one order
        out[split] = [Example(text=t, label=LABELS[p == "pos"]) for p, _, t in rows]
    return out, source


@register("imdb")
def imdb(cfg) -> TaskData:
    reviews, source = read_imdb(cfg.data_dir() / "imdb")
    rng = random.Random(cfg.task.split_seed)
    train, validation = stratified_split(reviews["train"], cfg.task.validation_fraction, cfg.task.split_seed)
    test = list(reviews["test"])
    for rows in (train, validation, test):
        rng.shuffle(rows)
    return TaskData("imdb", TaskKind.CLASSIFICATION, LABELS, {"train": train, "validation": validation, "test": test},
                    main_metric="accuracy", files=[source],
                    notes=[f"validation = stratified {cfg.task.validation_fraction:.0%} of the {len(reviews['train']):,} "
                           f"train reviews (seed {cfg.task.split_seed}); test = the {len(test):,} test reviews",
                           f"reviews longer than model.max_length={cfg.model.max_length} tokens are "
                           f"truncated (the head reads the first {cfg.model.max_length} tokens)"])
