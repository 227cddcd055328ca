"""Your own data, read from config alone: task 'files'.

    task: {train: reviews.csv, text: review, label: stars}       # validation, test, text_pair, kind optional

Formats: csv (standard quoting), tsv (tab-separated, no quoting, as the GLUE files), jsonl (one object a
line; token tasks: lists under `tokens` and `tags`), conll (one word a line, blank line between
sentences, -DOCSTART- lines skipped, tag column configurable, IOB1 converted on request) and hf (a
Hugging Face dataset saved with save_to_disk, or a hub name when a network exists).

Reading happens in two steps: a file becomes a Table of (location, {column: value}) rows (tables.py),
then rows become Examples of the task's kind (here). Every problem is a DataError naming the file and line.
"""
from __future__ import annotations

import math
from pathlib import Path

from adalayers.config import TASK_KINDS
from adalayers.data.tasks.conll import iob1_to_iob2  # noqa: F401  (one converter; tests import it from here too)
from adalayers.errors import DataError
from adalayers.metrics import MAIN_METRICS
from adalayers.data.tasks.base import Example, TaskData, register, stratified_split
from adalayers.data.tasks.tables import Table, is_number, read_tables
from adalayers.kinds import TaskKind

KIND_WORDS = {TaskKind.CLASSIFICATION: "classification", TaskKind.REGRESSION: "regression", TaskKind.TOKENS: "tokens"}


# --- tables -> examples ---------------------------------------------------------------------------

def _key(spec, keys: list, where: str):
    """The row key a column spec names; a missing column names the columns that exist."""
    if spec in keys:
        return spec
    if is_number(spec) and keys and all(isinstance(k, int) for k in keys):
        if -len(keys) <= int(spec) < len(keys):
            return keys[int(spec)]
    shown = ", ".join(map(str, keys)) if keys and isinstance(keys[0], str) else f"0-{len(keys) - 1}"
    raise DataError(f"{where}: no column {spec!r} (columns: {shown})")


def _value(loc: str, row: dict, spec):
    return row[_key(spec, list(row), loc)]


def _text(loc, row, spec, what) -> str:
    v = _value(loc, row, spec)
    if not isinstance(v, str) or not v.strip():
        raise DataError(f"{loc}: {what} column {spec!r} is {'empty' if v in ('', None) else f'not text: {v!r}'}")
    return v


def _number(v):
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    try:
        return float(str(v).strip())
    except ValueError:
        return None


def _finite(v) -> float | None:
    """The number in a cell, or None when it is not one or not finite (nan, inf, 1e999)."""
    n = _number(v)
    return n if n is not None and math.isfinite(n) else None


def guess_kind(t, fmt: str, train: Table) -> tuple[TaskKind, str]:
    """(kind, why): the configured kind, or one read off the training labels."""
    if t.kind:
        return TASK_KINDS[t.kind], "set in task.kind"
    if fmt == "conll":
        return TaskKind.TOKENS, "a CoNLL file"
    label = "label" if t.label is None else t.label
    first_loc, first = train.rows[0]
    if train.where_columns and not (t.label is None and "tags" in train.columns):
        _key(label, train.columns, train.where_columns)  # a missing column, reported at the header
    if label not in first and "tags" in first and isinstance(first["tags"], list):
        return TaskKind.TOKENS, "lists of tags"
    v = _value(first_loc, first, label)
    if isinstance(v, list):
        return TaskKind.TOKENS, "the labels are lists"
    if label in (train.names or {}):
        return TaskKind.CLASSIFICATION, "class names in the dataset"
    values = [(loc, _value(loc, row, label)) for loc, row in train.rows]
    decimal = next(((loc, x) for loc, x in values if (n := _number(x)) is not None and not n.is_integer()), None)
    if decimal is None:
        return TaskKind.CLASSIFICATION, "the labels are names or whole numbers"
    bad = next(((loc, x) for loc, x in values if _number(x) is None), None)
    if bad:
        raise DataError(f"{bad[0]}: label {bad[1]!r} is not a number, but column {label!r} holds numbers (e.g. "
                        f"{decimal[1]!r} at {decimal[0]}); fix the row, or set task.kind: classification")
    return TaskKind.REGRESSION, "the labels are numbers with decimals"


def count_classes(t, train: Table) -> int:
    """How many different labels the training table holds (task.label's column, default 'label')."""
    label = "label" if t.label is None else t.label
    return len({str(_value(loc, row, label)).strip() for loc, row in train.rows})


def _label_name(t, loc, v, names: list[str] | None) -> str:
    if names is not None and isinstance(v, int) and 0 <= v < len(names):
        v = names[v]
    if v is None or (isinstance(v, str) and not v.strip()):
        raise DataError(f"{loc}: empty label")
    if isinstance(v, (dict, list)):
        raise DataError(f"{loc}: label must be a single value, got {type(v).__name__}")
    raw = str(v).strip()
    if t.label_names:
        mapping = {str(k): str(n) for k, n in t.label_names.items()}
        if raw not in mapping:
            raise DataError(f"{loc}: label {raw!r} is not in task.label_names ({', '.join(mapping)})")
        return mapping[raw]
    return raw


def to_examples(t, table: Table, kind: str) -> tuple[list[Example], list[str]]:
    """Examples and their locations (for messages about a row)."""
    text = t.text if t.text is not None else ("tokens" if kind == TaskKind.TOKENS else "text")
    label = t.label if t.label is not None else ("tags" if kind == TaskKind.TOKENS else "label")
    if table.where_columns:  # a header: check it once, naming its line
        for spec in (text, t.text_pair, label):
            if spec is not None:
                _key(spec, table.columns, table.where_columns)
    examples, locs = [], []
    for loc, row in table.rows:
        if kind == TaskKind.TOKENS:
            examples.append(_token_example(t, table, loc, row, text, label))
        elif kind == TaskKind.REGRESSION:
            v = _value(loc, row, label)
            n = _finite(v)
            if n is None:
                what = "a number" if _number(v) is None else "a finite number"
                raise DataError(f"{loc}: label {v!r} is not {what} (a regression task needs a finite number in "
                                f"every row of column {label!r})")
            examples.append(Example(text=_text(loc, row, text, "text"), label=n))
        else:
            names = (table.names or {}).get(label)
            examples.append(Example(text=_text(loc, row, text, "text"),
                                    label=_label_name(t, loc, _value(loc, row, label), names)))
        if t.text_pair is not None and kind != TaskKind.TOKENS:
            examples[-1].text_pair = _text(loc, row, t.text_pair, "text_pair")
        locs.append(loc)
    return examples, locs


def _token_example(t, table, loc, row, text, label) -> Example:
    if "lines" in row:  # CoNLL: columns already picked
        words, tags = row["tokens"], row["tags"]
    else:
        words, tags = _value(loc, row, text), _value(loc, row, label)
        for what, v in (("tokens", words), ("tags", tags)):
            if not isinstance(v, list) or not v:
                raise DataError(f"{loc}: {what} must be a non-empty list, got {v!r}")
        names = (table.names or {}).get(label)
        tags = [names[x] if names and isinstance(x, int) else str(x) for x in tags]
        words = [str(w) for w in words]
        if len(words) != len(tags):
            raise DataError(f"{loc}: {len(words)} tokens but {len(tags)} tags")
    if t.tag_scheme == "iob1":
        tags = iob1_to_iob2(tags)
    for i, tag in enumerate(tags):
        if tag != "O" and not tag.startswith(("B-", "I-")):
            where = f"{table.source}:{row['lines'][i]}" if "lines" in row else loc
            raise DataError(f"{where}: tag {tag!r} is not O, B-TYPE or I-TYPE (token tasks are scored by entity F1)")
    return Example(words=words, tags=tags)


def _label_order(t, kind: str, train: list[Example], table: Table, label) -> list[str]:
    if kind == TaskKind.REGRESSION:
        return []
    if t.label_names:
        return [str(n) for n in dict.fromkeys(t.label_names.values())]
    names = (table.names or {}).get(label)
    if names:
        return names
    seen = {x for e in train for x in (e.tags if kind == TaskKind.TOKENS else [e.label])}
    if kind == TaskKind.TOKENS:  # O first, then each entity type's B- and I- together (as the built-in CoNLL reader)
        return sorted(seen, key=lambda x: ("", "") if x == "O" else (x[2:], x[:2]))
    numeric = all(is_number(x) for x in seen)
    return sorted(seen, key=lambda x: (int(x), x) if numeric else (0, x))


@register("files")
def files(cfg) -> TaskData:
    t, task = cfg.task.files, cfg.task
    fmt, tables = read_tables(t)
    kind, why = guess_kind(t, fmt, tables["train"])
    splits, locs = {}, {}
    for split, table in tables.items():
        splits[split], locs[split] = to_examples(t, table, kind)
    label = t.label if t.label is not None else ("tags" if kind == TaskKind.TOKENS else "label")
    labels = _label_order(t, kind, splits["train"], tables["train"], label)
    _check_unseen(kind, labels, splits, locs)
    notes = [f"{KIND_WORDS[kind]} task ({why}), {fmt} format; train: {tables['train'].source} "
             f"({len(splits['train'])} {'sentences' if kind == 'token' else 'rows'})"]
    if kind == TaskKind.TOKENS and t.tag_scheme == "iob2":
        notes += _iob1_hint(splits["train"], locs["train"])
    if labels:
        notes.append(f"labels ({len(labels)}): {', '.join(labels[:20])}{' ...' if len(labels) > 20 else ''}")
    if "validation" not in splits:
        try:
            splits["train"], splits["validation"] = stratified_split(splits["train"], task.validation_fraction,
                                                                     task.split_seed)
        except ValueError as e:
            raise DataError(f"{tables['train'].source}: cannot hold out a validation_fraction of "
                            f"{task.validation_fraction} ({e}); give a validation file or more rows") from None
        how = "stratified " if kind == TaskKind.CLASSIFICATION else ""
        notes.append(f"validation = {how}{task.validation_fraction:.0%} of train (seed {task.split_seed}): "
                     f"{len(splits['validation'])} rows")
    else:
        notes.append(f"validation: {tables['validation'].source} ({len(splits['validation'])})")
    if "test" in splits:
        notes.append(f"test: {tables['test'].source} ({len(splits['test'])})")
    else:
        notes.append("no test file given: only validation is reported (set task.test to score a test set)")
    main = MAIN_METRICS[kind][0]
    files_read = [Path(tb.source) for tb in tables.values()] if fmt != "hf" else _hf_files(t.train)
    return TaskData("files", kind, labels, splits, main_metric=main, files=files_read, notes=notes)


def _check_unseen(kind, labels, splits, locs) -> None:
    if kind == TaskKind.REGRESSION:
        return
    known = set(labels)
    for split in ("train", "validation", "test"):
        for e, loc in zip(splits.get(split, []), locs.get(split, [])):
            for x in (e.tags if kind == TaskKind.TOKENS else [e.label]):
                if x not in known:
                    shown = ", ".join(labels[:20]) + (" ..." if len(labels) > 20 else "")
                    what = "is not in task.label_names" if split == "train" else "does not occur in train"
                    raise DataError(f"{loc}: label {x!r} {what} (train labels: {shown})")


def _iob1_hint(examples: list[Example], locs: list[str]) -> list[str]:
    for e, loc in zip(examples, locs):
        if iob1_to_iob2(e.tags) != e.tags:
            return [f"some entities start with I- (first in the sentence at {loc}): if the tags are IOB1, as in "
                    f"the original CoNLL-2003 files, set task.tag_scheme: iob1"]
    return []


def _hf_files(train: str) -> list[Path]:
    folder = Path(train).expanduser()
    return sorted(p for p in folder.rglob("*") if p.is_file()) if folder.is_dir() else []
