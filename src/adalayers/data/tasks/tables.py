"""Files -> tables: the first step of reading your own data (task 'files').

A file becomes a Table of (location "file:line", {column: value}) rows. Formats: csv (standard
quoting), tsv (tab-separated, no quoting, as the GLUE files), jsonl, conll (one word a line) and hf
(a saved Hugging Face dataset). Every problem is a DataError naming the file and line.
"""
from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

from adalayers.errors import ConfigError, DataError
from adalayers.data.tasks.base import bad_row, require_file

EXTENSIONS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl",
              ".json": "jsonl", ".conll": "conll", ".iob": "conll", ".bio": "conll"}


@dataclass
class Table:
    source: str                       # the file (or dataset split) for messages
    columns: list                     # header names / JSON keys of the first row / column numbers
    where_columns: str | None = None  # where every row has these columns: the header's location
    rows: list[tuple[str, dict]] = None  # (location "file:line", {column: value})
    names: dict | None = None         # hf ClassLabel names per column: {column: [names]}


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


def is_number(spec) -> bool:
    return isinstance(spec, int) or (isinstance(spec, str) and spec.lstrip("-").isdigit())


MAX_LINE_BYTES = 8 * 1024 * 1024  # one line of a CSV/TSV/JSON Lines file; a longer line is a bad row


def _raw_lines(f, limit: int):
    """The file's lines as bytes, each read with at most `limit` + 1 bytes in memory; a longer line is
    skipped to its end in bounded chunks and given as None."""
    while True:
        raw = f.readline(limit + 1)
        if not raw:
            return
        if len(raw) > limit and not raw.endswith(b"\n"):
            while raw and not raw.endswith(b"\n"):
                raw = f.readline(1 << 20)
            yield None
            continue
        yield raw


def iter_lines(path: Path, start: int = 0, limit: int | None = None):
    """The file's lines after the first `start`, decoded one at a time (bounded memory: a line longer than
    `limit` bytes (default MAX_LINE_BYTES) or not UTF-8 is a bad row naming its number, given as an empty line)."""
    limit = limit or MAX_LINE_BYTES
    with open(require_file(path), "rb") as f:
        for n, raw in enumerate(_raw_lines(f, limit), start=1):
            if n <= start:
                continue
            if raw is None:
                bad_row(f"{path}:{n}: the line is longer than {limit} bytes")
                yield "\n"
                continue
            try:  # a BOM (Excel's CSV) is not part of the first column name
                yield raw.decode("utf-8-sig" if n == 1 else "utf-8")
            except UnicodeDecodeError as e:
                bad_row(f"{path}:{n}: not valid UTF-8 ({e.reason}); save the file as UTF-8")
                yield "\n"


def _nonblank(path: Path, lines):
    """Pass lines through; at the end, an all-blank file is an error."""
    seen = False
    for line in lines:
        seen = seen or bool(line.strip())
        yield line
    if not seen:
        raise DataError(f"{path}: empty file")


def iter_delimited(path: Path, delimiter: str, header: bool):
    """Stream a CSV/TSV file: ("file:line", {column: value}) per data row, the line where the row starts.

    Columns are the header's names (header=True) or 0..n-1; a row with another number of cells is a bad row.
    A row the parser refuses (a quote never closed, text after a closing quote, a field over the csv
    module's size limit) is a bad row named by its first line, and parsing starts again on the next line:
    an unterminated quote costs its own row, never the rest of the file.
    """
    columns, skip, kind = None, 0, "TSV" if delimiter == "\t" else "CSV"
    while True:  # once, plus once more after each bad row that spans lines
        lines = iter_lines(path, skip)
        reader = csv.reader(_nonblank(path, lines) if skip == 0 else lines, delimiter=delimiter,
                            quoting=csv.QUOTE_NONE if kind == "TSV" else csv.QUOTE_MINIMAL, strict=True)
        end, restart = skip, None
        while restart is None:
            try:
                cells = next(reader, None)
            except csv.Error as e:
                first, end = end + 1, skip + reader.line_num
                if columns is None:
                    raise DataError(f"{path}:{first}: not valid {kind} ({e})") from None
                what = "a quoted field opened here is never closed" if "end of data" in str(e) else f"not valid {kind} ({e})"
                span = f"; lines {first}-{end} would be one row" if end > first else ""
                bad_row(f"{path}:{first}: {what}{span}")
                restart = first if end > first else None  # parse the following lines again on their own
                continue
            if cells is None:
                return
            line, end = end + 1, skip + reader.line_num  # a quoted field may span lines: where the row starts
            if not cells or not any(c.strip() for c in cells):
                continue
            if columns is None:
                columns = _columns(path, line, cells, header)
                if header:
                    continue
            if len(cells) != len(columns):
                shown = ", ".join(map(str, columns)) if header else f"the first row's {len(columns)}"
                bad_row(f"{path}:{line}: expected {len(columns)} columns ({shown}), got {len(cells)}")
                continue
            yield f"{path}:{line}", dict(zip(columns, cells))
        skip = restart


def _columns(path: Path, line: int, cells: list[str], header: bool) -> list:
    """The column names from a header row (each once), or 0..n-1 without a header."""
    if not header:
        return list(range(len(cells)))
    columns = [c.strip() for c in cells]
    twice = sorted({c for c in columns if columns.count(c) > 1})
    if twice:
        raise DataError(f"{path}:{line}: column {', '.join(map(repr, twice))} appears more than once "
                        f"in the header; rename or remove the extra column")
    return columns


def read_delimited(path: Path, delimiter: str, header: bool) -> Table:
    rows = list(iter_delimited(path, delimiter, header))
    if not rows:
        raise DataError(f"{path}: no data rows" + (" after the header" if header else ""))
    return Table(str(path), list(rows[0][1]), f"{path}:1" if header else str(path), rows)


def iter_jsonl(path: Path):
    """Stream a JSON Lines file: ("file:line", object) per non-blank line; a line that is not an object is bad."""
    for n, line in enumerate(_nonblank(path, iter_lines(path)), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            bad_row(f"{path}:{n}: not valid JSON ({e.msg}); JSON Lines needs one object per line")
            continue
        except RecursionError:
            bad_row(f"{path}:{n}: the JSON is nested too deeply to read")
            continue
        if not isinstance(obj, dict):
            bad_row(f"{path}:{n}: expected a JSON object, got {type(obj).__name__}; JSON Lines needs one "
                    f"object per line")
            continue
        yield f"{path}:{n}", obj


def read_jsonl(path: Path) -> Table:
    rows = list(iter_jsonl(path))
    if not rows:
        raise DataError(f"{path}: no JSON objects")
    return Table(str(path), list(rows[0][1]), None, rows)


def conll_sentences(lines: Iterable[str]) -> Iterator[list[tuple[int, list[str]]]]:
    """The CoNLL layout: one word a line, columns split by whitespace; a blank line or a -DOCSTART-
    line ends a sentence. Yields each sentence as [(line number, columns), ...]. Every CoNLL reader
    (task 'files' with format conll, and CoNLL-2003) splits with this."""
    sentence: list[tuple[int, list[str]]] = []
    for n, line in enumerate(lines, start=1):
        cols = line.split()
        if not cols or cols[0] == "-DOCSTART-":
            if sentence:
                yield sentence
            sentence = []
            continue
        sentence.append((n, cols))
    if sentence:
        yield sentence


def read_conll(path: Path, word_col, tag_col) -> Table:
    """Sentences as rows {"tokens": [...], "tags": [...], "lines": [...]}; -DOCSTART- lines are skipped."""
    for name, spec in (("text", word_col), ("label", tag_col)):
        if not is_number(spec):
            raise ConfigError(f"task.{name}: CoNLL files have no header; give a column number, got {spec!r}")
    word_col, tag_col = int(word_col), int(tag_col)
    rows, width, first = [], None, None
    for sentence in conll_sentences(_decode(path).splitlines()):
        for n, cols in sentence:
            if width is None:
                width, first = len(cols), n
                for spec in (word_col, tag_col):
                    if not -width <= spec < width:
                        raise DataError(f"{path}:{n}: no column {spec} (lines have {width} columns, 0-{width - 1})")
            elif len(cols) != width:
                raise DataError(f"{path}:{n}: expected {width} columns like line {first}, got {len(cols)}")
        rows.append((f"{path}:{sentence[0][0]}", {"tokens": [c[word_col] for _, c in sentence],
                                                  "tags": [c[tag_col] for _, c in sentence],
                                                  "lines": [n for n, _ in sentence]}))
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
    header = t.header if t.header is not None else any(not is_number(s) for s in specs) or not specs
    if fmt in ("csv", "tsv") and not header and any(not is_number(s) for s in specs):
        raise ConfigError("task.header is false, so columns must be given by number (0 = the first)")
    return fmt, {split: read_file(t, getattr(t, split), fmt, header)
                 for split in ("train", "validation", "test") if getattr(t, split)}
