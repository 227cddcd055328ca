"""`adalayers train --data FILE`: a whole config from a few flags (load_config: the config of a train command line,
from its config file or from these flags).

The task comes from the flags; every other setting from --config, or else from the built-in config
closest to the data's kind (classification: cola.yaml, regression: stsb.yaml, tokens: conll.yaml).
"""
from __future__ import annotations

import math
from pathlib import Path

from adalayers.data.tasks.files import KIND_WORDS, count_classes, guess_kind
from adalayers.data.tasks.tables import is_number, read_tables
from adalayers.errors import ConfigError
from adalayers.kinds import TaskKind


FEW_STEPS = 2_000      # optimizer steps of 32 rows of REFERENCE_TOKENS tokens: the work below which the
REFERENCE_TOKENS = 12  # small-data defaults apply is FEW_STEPS * batch_size * REFERENCE_TOKENS tokens (CoLA's rows)
TOKENS_PER_WORD = 1.3  # the estimate of a text's tokens from its words (the tokenizer is not loaded yet)
SMALL_DATA_LR = 1e-3
MAX_SMALL_EPOCHS = 200
MANY_CLASSES = 10      # classification with this many labels or more: early stopping, not the epoch cap, ends it
MANY_CLASS_EPOCHS = 100
CLOSEST_CONFIG = {TaskKind.CLASSIFICATION: "cola.yaml", TaskKind.REGRESSION: "stsb.yaml", TaskKind.TOKENS: "conll.yaml"}


def _configs_dir() -> Path | None:
    for folder in (Path(__file__).resolve().parents[3] / "configs", Path.cwd() / "configs"):
        if folder.is_dir():
            return folder
    return None


def shortcut_config(config_path: str | None, task: dict, overrides: list[str]):
    """The task from flags; every other setting from `config_path`, or else from the built-in config
    closest to the data's kind (classification: cola.yaml, regression: stsb.yaml, tokens: conll.yaml)."""
    from adalayers import config as config_mod

    task = {"name": "files", **{k: v for k, v in task.items() if v is not None}}
    for key in ("text", "text_pair", "label"):
        if isinstance(task.get(key), str) and is_number(task[key]):
            task[key] = int(task[key])  # --label 1: a column number in a file without header
    for key in ("train", "validation", "test"):
        if key in task and Path(task[key]).expanduser().exists():  # the run folder works from any folder
            task[key] = str(Path(task[key]).expanduser().resolve())
    if config_path:
        base = config_mod.load(config_path).to_dict()
        base["task"] = {**base["task"], **task}
        print(f"settings from {config_path}; task from the command line")
    else:
        probe = config_mod.from_dict({"task": task})
        fmt, tables = read_tables(probe.task.files)
        kind, why = guess_kind(probe.task.files, fmt, tables["train"])
        folder = _configs_dir()
        path = folder / CLOSEST_CONFIG[kind] if folder else None
        if path and path.is_file():
            base = config_mod.load(path).to_dict()
            print(f"a {KIND_WORDS[kind]} task ({why}): settings from {path}")
        else:
            base = config_mod.Config().to_dict()
            print(f"a {KIND_WORDS[kind]} task ({why}): adalayers' default settings (no {CLOSEST_CONFIG[kind]} found)")
        keep = ("data_dir", "validation_fraction", "split_seed", "max_train_examples", "max_eval_examples")
        base["task"] = {**{k: base["task"][k] for k in keep}, **task}
        base["head"]["kind"] = None  # follows the data
        base["model"]["max_length"] = None  # chosen from the data (the closest config's was for its own task)
        classes = count_classes(probe.task.files, tables["train"]) if kind == TaskKind.CLASSIFICATION else None
        limit = config_mod.from_dict(base, overrides).task.max_train_examples  # the file's or --set's
        n_train = _fit_to_data(base, len(tables["train"].rows or []), classes, "validation" in tables, overrides,
                               tokens_per_row(tables["train"], task), limit)
        cfg = config_mod.from_dict(base, overrides)
        _say_settings(cfg.train, n_train, classes)
        return cfg
    return config_mod.from_dict(base, overrides)


def tokens_per_row(table, task: dict) -> float | None:
    """The training rows' mean token count, estimated from their words (TOKENS_PER_WORD, + 2 special tokens);
    None when the text columns are not named columns of the table."""
    cols = [task.get("text") or "text", task.get("text_pair")]
    rows = table.rows or []
    words = [sum(len(str(r.get(c, "")).split()) for c in cols if c is not None) for _, r in rows]
    if not rows or not any(isinstance(c, str) and c in rows[0][1] for c in cols):
        return None
    return TOKENS_PER_WORD * float(sum(words)) / len(words) + 2


def _fit_to_data(base: dict, rows: int, classes: int | None, own_validation: bool, overrides: list[str],
                 row_tokens: float | None = None, max_rows: int | None = None) -> int:
    """The closest config's lr and epochs are made for thousands of rows and two classes: a small file gets
    its own (few_step_defaults), a task of many classes more epochs (many_class_defaults), each said in the
    log; not when --set chooses any of them. Returns the training rows: the file's, less the validation share
    when the data has no validation file of its own, at most max_rows (task.max_train_examples)."""
    import logging

    log = logging.getLogger(__name__)
    chosen = {o.partition("=")[0].strip() for o in overrides or []}
    n_train = rows if own_validation else rows - round(rows * base["task"]["validation_fraction"])
    if max_rows is not None:
        n_train = min(n_train, max_rows)
    train = base["train"]
    if not chosen & {"train.lr", "train.max_epochs", "train.early_stopping", "train.batch_size"} and n_train >= 1:
        for note in (few_step_defaults(train, n_train, row_tokens), many_class_defaults(train, classes)):
            if note:
                log.info("%s", note)
    return n_train


def _say_settings(t, n_train: int, classes: int | None) -> None:
    """The training settings taken (`t`: the final config's train section, --set overrides included), in one
    log line."""
    import logging

    per_epoch = max(1, math.ceil(max(n_train, 1) / t.batch_size))
    logging.getLogger(__name__).info(
        "training settings: lr %g, batch %d (%d steps an epoch over %s training rows%s), max_epochs %d, "
        "early_stopping %s", t.lr, t.batch_size, per_epoch, f"{n_train:,}", f", {classes} classes" if classes else "",
        t.max_epochs, t.early_stopping)


def many_class_defaults(train: dict, classes: int | None) -> str | None:
    """Many classes: each class's examples are a small part of an epoch, and a head at the closest config's
    40 epochs was still improving at its last epochs (issue 40: 151 classes, best epoch 38 of 40). Raise
    max_epochs to MANY_CLASS_EPOCHS so that early stopping ends training; returns the log line, or None."""
    if classes is None or classes < MANY_CLASSES or train["max_epochs"] >= MANY_CLASS_EPOCHS:
        return None
    old = train["max_epochs"]
    train["max_epochs"] = MANY_CLASS_EPOCHS
    return (f"{classes} classes: train.max_epochs {MANY_CLASS_EPOCHS} (not {old}), so that early stopping "
            f"(train.early_stopping {train['early_stopping']}) ends training, not the cap; --set it to choose")


def few_step_defaults(train: dict, n_train: int, row_tokens: float | None = None) -> str | None:
    """A small training set: raise `train`'s lr and max_epochs (a config dict's train section, changed in
    place) so the head reads about FEW_STEPS * batch_size * REFERENCE_TOKENS tokens in all (the work of 2,000
    steps on CoLA-sized rows), and early_stopping with them; returns the log line saying so, or None when
    the data gives that much work as it is. Counted in tokens, not steps: 1,000 long texts reach it in a few
    epochs where 2,000 steps would take 63 (issue 55). row_tokens: the rows' mean token count (None:
    REFERENCE_TOKENS)."""
    per_row = max(row_tokens or REFERENCE_TOKENS, 1.0)
    target = FEW_STEPS * train["batch_size"] * REFERENCE_TOKENS
    per_epoch = n_train * per_row
    if per_epoch * train["max_epochs"] >= target:
        return None
    old = dict(train)
    train["lr"] = max(train["lr"], SMALL_DATA_LR)
    train["max_epochs"] = max(train["max_epochs"], min(MAX_SMALL_EPOCHS, math.ceil(target / per_epoch)))
    train["early_stopping"] = max(train["early_stopping"], train["max_epochs"] // 4)
    changed = ", ".join(f"train.{k} {train[k]:g} (not {old[k]:g})" for k in ("lr", "max_epochs", "early_stopping")
                        if train[k] != old[k])
    if not changed:
        return None
    return (f"small data set: {n_train:,} training rows of about {per_row:.0f} tokens give {per_epoch:,.0f} tokens "
            f"an epoch (the defaults are made for {target:,} in all), so {changed}; --set them to choose")


def add_data_args(p) -> None:
    own = p.add_argument_group("your own data (task 'files'; other settings from the config, or the built-in "
                               "one closest to the data: cola.yaml, stsb.yaml, conll.yaml)")
    own.add_argument("--data", help="training file (.csv .tsv .jsonl .conll) or a saved Hugging Face dataset folder")
    own.add_argument("--validation", help="validation file (default: a stratified 10%% of --data)")
    own.add_argument("--test", help="test file (default: none; validation only is reported)")
    own.add_argument("--text", help="text column: a name, or a number in a file without header (default: text)")
    own.add_argument("--text-pair", help="second text column, for sentence-pair tasks")
    own.add_argument("--label", help="label column (default: label)")
    own.add_argument("--kind", choices=["classification", "regression", "tokens"], help="default: guessed")
    own.add_argument("--format", choices=["csv", "tsv", "jsonl", "conll", "hf"], help="default: from the extension")


def config_from_args(args, overrides: list[str]):
    task = {"train": args.data, "validation": args.validation, "test": args.test, "text": args.text,
            "text_pair": args.text_pair, "label": args.label, "kind": args.kind, "format": args.format}
    return shortcut_config(args.config, task, overrides)


def flag_overrides(args) -> list[str]:
    """The --set overrides with train's own flags after them: --keep is train.keep, --time-budget
    train.time_budget (every path of `train`, --seeds and --select-layers included, reads them here)."""
    flags = {"keep": "train.keep", "time_budget": "train.time_budget"}
    return [*args.overrides, *(f"{key}={getattr(args, flag)}" for flag, key in flags.items()
                               if getattr(args, flag, None) is not None)]


def load_config(args):
    """The run config of a train (or compare) command line: a YAML file with --set overrides, or --data FILE ...
    without one."""
    from adalayers import config

    if args.data:
        return config_from_args(args, flag_overrides(args))
    if not args.config:
        raise ConfigError("give a config file (see configs/), or your data: --data FILE --text COLUMN --label COLUMN")
    return config.load(args.config, flag_overrides(args))
