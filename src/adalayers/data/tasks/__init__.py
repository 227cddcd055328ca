"""Dataset readers. Each module registers its tasks by name with `@register("name")`.

A reader turns files into a TaskData: labelled examples per split, the label names, the
task's kind (sequence / regression / token) and the metric that picks the best epoch.
"""
from __future__ import annotations

import contextlib
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from adalayers.errors import ConfigError, DataError
from adalayers.kinds import TaskKind


@dataclass
class Example:
    text: str | None = None
    text_pair: str | None = None
    label: Any = None               # a label name (classification) or a float (regression)
    words: list[str] | None = None  # token tasks: the words ...
    tags: list[str] | None = None   # ... and one tag per word


@dataclass
class TaskData:
    name: str
    kind: TaskKind                  # what is predicted (a plain string is parsed into one)
    labels: list[str]               # label names; empty for regression
    splits: dict[str, list[Example]]
    main_metric: str                # the validation metric that selects the best epoch
    files: list[Path] = field(default_factory=list)  # the files read (hashed into cache keys)
    notes: list[str] = field(default_factory=list)   # facts a report should state (splits, truncation)

    def __post_init__(self):
        self.kind = TaskKind.parse(self.kind)


TASKS: dict[str, Callable] = {}
_skipped: ContextVar[list | None] = ContextVar("skipped_rows", default=None)


def bad_row(message: str) -> None:
    """A reader found a malformed row: raise it, or with task.skip_bad_rows count it (the reader skips it)."""
    skipped = _skipped.get()
    if skipped is None:
        raise DataError(message)
    skipped.append(message)


@contextlib.contextmanager
def skipping_bad_rows(skip: bool):
    """Within: bad_row raises (skip=False) or appends its message to the yielded list (skip=True)."""
    token = _skipped.set([] if skip else None)
    try:
        yield _skipped.get()
    finally:
        _skipped.reset(token)


PAIR_TASKS: set[str] = set()  # built-in tasks whose examples are sentence pairs (text, text_pair)


def register(name: str, pairs: bool = False):
    """`pairs=True`: the task's examples are sentence pairs, so its heads must be given two texts."""
    def wrap(fn):
        TASKS[name] = fn
        if pairs:
            PAIR_TASKS.add(name)
        return fn
    return wrap


def takes_pairs(cfg) -> bool:
    """Was a head with this config trained on sentence pairs? (your files: task.text_pair is set)"""
    from adalayers.data.tasks import conll, files, glue, imdb, qqp, sst  # noqa: F401  (register their tasks)

    return cfg.task.name in PAIR_TASKS or (cfg.task.name == "files" and cfg.task.files.text_pair is not None)


def check_pairs(name: str, pairs: bool, text_pairs: list | None, n_texts: int) -> None:
    """Refuse single texts for a head trained on pairs, and pairs for a head trained on single texts."""
    if pairs and text_pairs is None:
        raise DataError(f"{name} was trained on sentence pairs: give each text its second text "
                        f"(predict --pair A B, predict-files --text-pair-column, text_pairs=[...], "
                        f"or [a, b] in the service's texts)")
    if not pairs and text_pairs is not None:
        raise DataError(f"{name} was trained on single texts, not sentence pairs: give texts without a second text")
    if text_pairs is not None and len(text_pairs) != n_texts:
        raise DataError(f"{n_texts} texts but {len(text_pairs)} second texts: give one second text per text")


def load_task(cfg) -> TaskData:
    from adalayers.data.tasks import conll, files, glue, imdb, qqp, sst  # noqa: F401  (register their tasks)

    if cfg.task.name not in TASKS:
        raise ConfigError(f"task.name: unknown task {cfg.task.name!r} (known: {', '.join(sorted(TASKS))})")
    with skipping_bad_rows(cfg.task.skip_bad_rows) as skipped:
        data = TASKS[cfg.task.name](cfg)
    if skipped:
        data.notes.append(f"skipped {len(skipped)} bad rows (task.skip_bad_rows); the first: {skipped[0]}")
    if cfg.task.metric:
        from adalayers.metrics import MAIN_METRICS

        if cfg.task.metric not in MAIN_METRICS[data.kind]:
            raise ConfigError(f"task.metric: a {data.kind} task can select on {', '.join(MAIN_METRICS[data.kind])}, "
                              f"not {cfg.task.metric!r}")
        data.main_metric = cfg.task.metric
    binary = data.kind == TaskKind.CLASSIFICATION and len(data.labels) == 2
    if (cfg.task.positive_label is not None or cfg.task.metric == "positive_f1") and not binary:
        raise ConfigError(f"task.positive_label / positive_f1: task {data.name} is not a binary classification "
                          f"task ({data.kind}, {len(data.labels)} labels)")
    if cfg.task.positive_label is not None and cfg.task.positive_label not in data.labels:
        raise ConfigError(f"task.positive_label: {cfg.task.positive_label!r} is not a label of task {data.name} "
                          f"(labels: {', '.join(data.labels)})")
    if binary:
        positive = cfg.task.positive_label or data.labels[1]
        data.notes.append(f"positive class for precision/recall/F1: {positive!r} (change with "
                          f"--set task.positive_label=LABEL)")
    for split in ("train", "validation"):
        if not data.splits.get(split):
            raise DataError(f"task {data.name}: the {split} split is empty")
    check_classes(data)
    if cfg.task.max_train_examples:
        data.splits["train"] = data.splits["train"][: cfg.task.max_train_examples]
    if cfg.task.max_eval_examples:
        for split in ("validation", "test"):
            if split in data.splits:
                data.splits[split] = data.splits[split][: cfg.task.max_eval_examples]
    return data


def check_classes(data: TaskData) -> None:
    """A classifier needs at least two classes among its training labels (one class: loss 0, F1 1.0, nothing learnt)."""
    if data.kind == TaskKind.REGRESSION:
        return
    seen = {t for e in data.splits["train"] for t in (e.tags or [])} if data.kind == TaskKind.TOKENS \
        else {e.label for e in data.splits["train"]}
    if len(seen) < 2:
        raise DataError(f"task {data.name}: every training example has the {'tag' if data.kind == 'token' else 'label'} "
                        f"{next(iter(seen), None)!r}; a classifier needs at least two classes")


def stratified_split(examples: list[Example], fraction: float, seed: int) -> tuple[list[Example], list[Example]]:
    """Hold out `fraction` of examples, stratified by label (regression / token tasks: random)."""
    from sklearn.model_selection import train_test_split

    if len(examples) * fraction < 1 or len(examples) < 2:
        raise DataError(f"cannot hold out {fraction:.0%} of {len(examples)} training examples for validation; "
                        f"give a validation file or more training data")
    idx = list(range(len(examples)))
    labels = [e.label for e in examples]
    stratify = labels if all(isinstance(x, str) for x in labels) else None
    try:
        keep, held = train_test_split(idx, test_size=fraction, random_state=seed, stratify=stratify)
    except ValueError:  # a class too rare to stratify: hold out at random instead
        keep, held = train_test_split(idx, test_size=fraction, random_state=seed)
    return [examples[i] for i in sorted(keep)], [examples[i] for i in sorted(held)]


def require_file(path: Path) -> Path:
    if not path.is_file():
        raise DataError(f"data file not found: {Path(path).absolute()} (set task.data_dir or ADALAYERS_DATA)")
    return path


def read_lines(path: Path) -> list[str]:
    """A text file's lines; bytes that are not UTF-8 are reported with their line number."""
    raw = require_file(path).read_bytes()
    try:
        return raw.decode("utf-8").splitlines()
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not valid UTF-8 ({e.reason})") from None
