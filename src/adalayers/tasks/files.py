"""Your own data, read from config alone: task 'files'.

    task: {train: reviews.csv, text: review, label: stars}       # validation, test, text_pair, kind optional

Formats: csv (standard quoting), tsv (tab-separated, no quoting, as the GLUE files), jsonl (one object a
line; token tasks: lists under `tokens` and `tags`), conll (one word a line, blank line between
sentences, -DOCSTART- lines skipped, tag column configurable, IOB1 converted on request) and hf (a
Hugging Face dataset saved with save_to_disk, or a hub name when a network exists).

Reading happens in two steps: a file becomes a Table of (location, {column: value}) rows, then rows
become Examples of the task's kind. Every problem is a DataError naming the file and line.
"""
from __future__ import annotations

import csv
import io
import json
from dataclasses import dataclass
from pathlib import Path

from adalayers.config import TASK_KINDS
from adalayers.errors import ConfigError, DataError
from adalayers.metrics import MAIN_METRICS
from adalayers.tasks import Example, TaskData, bad_row, register, require_file, stratified_split

EXTENSIONS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl",
              ".json": "jsonl", ".conll": "conll", ".iob": "conll", ".bio": "conll"}
KIND_WORDS = {"sequence": "classification", "regression": "regression", "token": "tokens"}


@dataclass
class Table:
    source: str                       # the file (or dataset split) for messages
    columns: list                     # header names / JSON keys of the first row / column numbers
    where_columns: str | None = None  # where every row has these columns: the header's location
    rows: list[tuple[str, dict]] = None  # (location "file:line", {column: value})
    names: dict | None = None         # hf ClassLabel names per column: {column: [names]}


# --- files -> tables ------------------------------------------------------------------------------

def file_format(t) -> str:
    if t.format:
        return t.format
    path = Path(t.train).expanduser()
    if path.is_dir():
        return "hf"
    if path.suffix.lower() in EXTENSIONS:
        return EXTENSIONS[path.suffix.lower()]
    if path.is_file():
        with open(path, "rb") as f:
            if f.read(10) == b"-DOCSTART-":  # CoNLL-2003's eng.train / eng.testa / eng.testb
                return "conll"
    raise ConfigError(f"task.format: cannot tell the format of {t.train} from its extension; set task.format "
                      f"to csv, tsv, jsonl, conll or hf")


def _decode(path: Path) -> str:
    raw = require_file(path).read_bytes()
    try:
        text = raw.decode("utf-8-sig")  # a BOM (Excel's CSV) is not part of the first column name
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise DataError(f"{path}:{line}: not valid UTF-8 ({e.reason}); save the file as UTF-8") from None
    if not text.strip():
        raise DataError(f"{path}: empty file")
    return text


def _is_number(spec) -> bool:
    return isinstance(spec, int) or (isinstance(spec, str) and spec.lstrip("-").isdigit())


def read_delimited(path: Path, delimiter: str, header: bool) -> Table:
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    reader = csv.reader(io.StringIO(_decode(path), newline=""), delimiter=delimiter, quoting=quoting)
    columns, rows, end = None, [], 0
    try:
        for cells in reader:
            line, end = end + 1, reader.line_num  # a quoted field may span lines: report where the row starts
            if not cells or not any(c.strip() for c in cells):
                continue
            if columns is None:
                columns = [c.strip() for c in cells] if header else list(range(len(cells)))
                if header:
                    continue
            if len(cells) != len(columns):
                shown = ", ".join(map(str, columns)) if header else f"the first row's {len(columns)}"
                bad_row(f"{path}:{line}: expected {len(columns)} columns ({shown}), got {len(cells)}")
                continue
            rows.append((f"{path}:{line}", dict(zip(columns, cells))))
    except csv.Error as e:
        raise DataError(f"{path}:{reader.line_num}: not valid {'TSV' if delimiter == chr(9) else 'CSV'} ({e})") from None
    if not rows:
        raise DataError(f"{path}: no data rows" + (" after the header" if header else ""))
    return Table(str(path), columns, f"{path}:1" if header else str(path), rows)


def read_jsonl(path: Path) -> Table:
    rows = []
    for n, line in enumerate(_decode(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            bad_row(f"{path}:{n}: not valid JSON ({e.msg}); JSON Lines needs one object per line")
            continue
        if not isinstance(obj, dict):
            bad_row(f"{path}:{n}: expected a JSON object, got {type(obj).__name__}; JSON Lines needs one "
                    f"object per line")
            continue
        rows.append((f"{path}:{n}", obj))
    return Table(str(path), list(rows[0][1]), None, rows)


def read_conll(path: Path, word_col, tag_col) -> Table:
    """Sentences as rows {"tokens": [...], "tags": [...], "lines": [...]}; -DOCSTART- lines are skipped."""
    for name, spec in (("text", word_col), ("label", tag_col)):
        if not _is_number(spec):
            raise ConfigError(f"task.{name}: CoNLL files have no header; give a column number, got {spec!r}")
    word_col, tag_col = int(word_col), int(tag_col)
    rows, words, tags, lines, width, first = [], [], [], [], None, None

    def flush():
        if words:
            rows.append((f"{path}:{lines[0]}", {"tokens": list(words), "tags": list(tags), "lines": list(lines)}))
        words.clear(), tags.clear(), lines.clear()

    for n, line in enumerate(_decode(path).splitlines(), start=1):
        cols = line.split()
        if not cols or cols[0] == "-DOCSTART-":
            flush()
            continue
        if width is None:
            width, first = len(cols), n
            for spec in (word_col, tag_col):
                if not -width <= spec < width:
                    raise DataError(f"{path}:{n}: no column {spec} (lines have {width} columns, 0-{width - 1})")
        elif len(cols) != width:
            raise DataError(f"{path}:{n}: expected {width} columns like line {first}, got {len(cols)}")
        words.append(cols[word_col]), tags.append(cols[tag_col]), lines.append(n)
    flush()
    if not rows:
        raise DataError(f"{path}: no sentences (one word a line, blank lines between sentences)")
    return Table(str(path), ["tokens", "tags"], None, rows)


def read_file(t, path: str, fmt: str, header: bool) -> Table:
    p = Path(path).expanduser()
    if fmt == "csv":
        return read_delimited(p, ",", header)
    if fmt == "tsv":
        return read_delimited(p, "\t", header)
    if fmt == "jsonl":
        return read_jsonl(p)
    return read_conll(p, 0 if t.text is None else t.text, -1 if t.label is None else t.label)


def read_hf(t) -> dict[str, Table]:
    """A saved DatasetDict / Dataset (or a hub name): splits train, validation (or task.validation), test."""
    try:
        import datasets
    except ImportError:
        raise ConfigError("task.format hf needs the datasets package: pip install 'adalayers[hf]'") from None
    source = Path(t.train).expanduser()
    try:
        ds = datasets.load_from_disk(str(source)) if source.is_dir() else datasets.load_dataset(t.train)
    except Exception as e:  # noqa: BLE001  (datasets raises many types; the user needs the first line)
        raise DataError(f"cannot load Hugging Face dataset {t.train!r}: {str(e).splitlines()[0]}") from None
    if isinstance(ds, datasets.Dataset):
        ds = {"train": ds}
    tables = {}
    for split, name in (("train", "train"), ("validation", t.validation or "validation"), ("test", t.test or "test")):
        if name not in ds:
            if split == "train" or getattr(t, split):
                raise DataError(f"{t.train}: no split {name!r} (splits: {', '.join(ds)})")
            continue
        d = ds[name]
        names = {}
        for col, feature in d.features.items():
            inner = getattr(feature, "feature", feature)  # Sequence / List of ClassLabel: the tags' names
            if hasattr(inner, "names"):
                names[col] = list(inner.names)
        rows = [(f"{t.train} [{name}] row {i + 1}", row) for i, row in enumerate(d)]
        if not rows:
            raise DataError(f"{t.train}: split {name!r} is empty")
        tables[split] = Table(f"{t.train} [{name}]", list(d.column_names), f"{t.train} [{name}]", rows, names)
    return tables


def read_tables(t) -> tuple[str, dict[str, Table]]:
    fmt = file_format(t)
    if fmt == "hf":
        return fmt, read_hf(t)
    specs = [s for s in (t.text, t.text_pair, t.label) if s is not None]
    header = t.header if t.header is not None else any(not _is_number(s) for s in specs) or not specs
    if fmt in ("csv", "tsv") and not header and any(not _is_number(s) for s in specs):
        raise ConfigError("task.header is false, so columns must be given by number (0 = the first)")
    return fmt, {split: read_file(t, getattr(t, split), fmt, header)
                 for split in ("train", "validation", "test") if getattr(t, split)}


# --- tables -> examples ---------------------------------------------------------------------------

def _key(spec, keys: list, where: str):
    """The row key a column spec names; a missing column names the columns that exist."""
    if spec in keys:
        return spec
    if _is_number(spec) and keys and all(isinstance(k, int) for k in keys):
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


def guess_kind(t, fmt: str, train: Table) -> tuple[str, str]:
    """(kind, why): the configured kind, or one read off the training labels."""
    if t.kind:
        return TASK_KINDS[t.kind], "set in task.kind"
    if fmt == "conll":
        return "token", "a CoNLL file"
    label = "label" if t.label is None else t.label
    first_loc, first = train.rows[0]
    if train.where_columns and not (t.label is None and "tags" in train.columns):
        _key(label, train.columns, train.where_columns)  # a missing column, reported at the header
    if label not in first and "tags" in first and isinstance(first["tags"], list):
        return "token", "lists of tags"
    v = _value(first_loc, first, label)
    if isinstance(v, list):
        return "token", "the labels are lists"
    if label in (train.names or {}):
        return "sequence", "class names in the dataset"
    values = [(loc, _value(loc, row, label)) for loc, row in train.rows]
    decimal = next(((loc, x) for loc, x in values if (n := _number(x)) is not None and not n.is_integer()), None)
    if decimal is None:
        return "sequence", "the labels are names or whole numbers"
    bad = next(((loc, x) for loc, x in values if _number(x) is None), None)
    if bad:
        raise DataError(f"{bad[0]}: label {bad[1]!r} is not a number, but column {label!r} holds numbers (e.g. "
                        f"{decimal[1]!r} at {decimal[0]}); fix the row, or set task.kind: classification")
    return "regression", "the labels are numbers with decimals"


def iob1_to_iob2(tags: list[str]) -> list[str]:
    """IOB1 starts an entity with I- unless it touches one of the same type; IOB2 always starts with B-."""
    out, prev = [], "O"
    for tag in tags:
        if tag.startswith("I-") and (prev == "O" or prev[2:] != tag[2:]):
            tag = "B-" + tag[2:]
        out.append(tag)
        prev = tag
    return out


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
    text = t.text if t.text is not None else ("tokens" if kind == "token" else "text")
    label = t.label if t.label is not None else ("tags" if kind == "token" else "label")
    if table.where_columns:  # a header: check it once, naming its line
        for spec in (text, t.text_pair, label):
            if spec is not None:
                _key(spec, table.columns, table.where_columns)
    examples, locs = [], []
    for loc, row in table.rows:
        if kind == "token":
            examples.append(_token_example(t, table, loc, row, text, label))
        elif kind == "regression":
            v = _value(loc, row, label)
            n = _number(v)
            if n is None:
                raise DataError(f"{loc}: label {v!r} is not a number (a regression task needs a number in every row "
                                f"of column {label!r})")
            examples.append(Example(text=_text(loc, row, text, "text"), label=n))
        else:
            names = (table.names or {}).get(label)
            examples.append(Example(text=_text(loc, row, text, "text"),
                                    label=_label_name(t, loc, _value(loc, row, label), names)))
        if t.text_pair is not None and kind != "token":
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
    if kind == "regression":
        return []
    if t.label_names:
        return [str(n) for n in dict.fromkeys(t.label_names.values())]
    names = (table.names or {}).get(label)
    if names:
        return names
    seen = {x for e in train for x in (e.tags if kind == "token" else [e.label])}
    if kind == "token":  # O first, then each entity type's B- and I- together (as the built-in CoNLL reader)
        return sorted(seen, key=lambda x: ("", "") if x == "O" else (x[2:], x[:2]))
    numeric = all(_is_number(x) for x in seen)
    return sorted(seen, key=lambda x: (int(x), x) if numeric else (0, x))


@register("files")
def files(cfg) -> TaskData:
    t = cfg.task
    fmt, tables = read_tables(t)
    kind, why = guess_kind(t, fmt, tables["train"])
    splits, locs = {}, {}
    for split, table in tables.items():
        splits[split], locs[split] = to_examples(t, table, kind)
    label = t.label if t.label is not None else ("tags" if kind == "token" else "label")
    labels = _label_order(t, kind, splits["train"], tables["train"], label)
    _check_unseen(kind, labels, splits, locs)
    notes = [f"{KIND_WORDS[kind]} task ({why}), {fmt} format; train: {tables['train'].source} "
             f"({len(splits['train'])} {'sentences' if kind == 'token' else 'rows'})"]
    if kind == "token" and t.tag_scheme == "iob2":
        notes += _iob1_hint(splits["train"], locs["train"])
    if labels:
        notes.append(f"labels ({len(labels)}): {', '.join(labels[:20])}{' ...' if len(labels) > 20 else ''}")
    if "validation" not in splits:
        try:
            splits["train"], splits["validation"] = stratified_split(splits["train"], t.validation_fraction,
                                                                     t.split_seed)
        except ValueError as e:
            raise DataError(f"{tables['train'].source}: cannot hold out a validation_fraction of "
                            f"{t.validation_fraction} ({e}); give a validation file or more rows") from None
        how = "stratified " if kind == "sequence" else ""
        notes.append(f"validation = {how}{t.validation_fraction:.0%} of train (seed {t.split_seed}): "
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
    if kind == "regression":
        return
    known = set(labels)
    for split in ("train", "validation", "test"):
        for e, loc in zip(splits.get(split, []), locs.get(split, [])):
            for x in (e.tags if kind == "token" else [e.label]):
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


# --- `adalayers train --data FILE`: a whole config from a few flags --------------------------------

CLOSEST_CONFIG = {"sequence": "cola.yaml", "regression": "stsb.yaml", "token": "conll.yaml"}


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
        if isinstance(task.get(key), str) and _is_number(task[key]):
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
        fmt, tables = read_tables(probe.task)
        kind, why = guess_kind(probe.task, fmt, tables["train"])
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
    return config_mod.from_dict(base, overrides)


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


def config_from_args(args):
    task = {"train": args.data, "validation": args.validation, "test": args.test, "text": args.text,
            "text_pair": args.text_pair, "label": args.label, "kind": args.kind, "format": args.format}
    return shortcut_config(args.config, task, args.overrides)
