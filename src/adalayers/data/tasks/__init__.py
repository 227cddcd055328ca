"""Dataset readers. Each module registers its tasks by name with `@register("name")` (adalayers.data.tasks.base);
importing this package imports every reader, so TASKS holds every built-in task.

A reader turns files into a TaskData: labelled examples per split, the label names, the
task's kind (sequence / regression / token) and the metric that picks the best epoch.
"""
from __future__ import annotations

from adalayers.data.tasks import conll, files, glue, imdb, qqp, sst  # noqa: F401  (register their tasks)
from adalayers.data.tasks.base import (PAIR_TASKS, TASKS, Example, TaskData, bad_row,  # noqa: F401  (the public names)
                                       check_classes, check_pairs, read_lines, register, require_file,
                                       skipping_bad_rows, stratified_split)
from adalayers.errors import ConfigError, DataError
from adalayers.kinds import TaskKind


def takes_pairs(cfg) -> bool:
    """Was a head with this config trained on sentence pairs? (your files: task.text_pair is set)"""
    return cfg.task.name in PAIR_TASKS or (cfg.task.name == "files" and cfg.task.files.text_pair is not None)


def load_task(cfg) -> TaskData:
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
