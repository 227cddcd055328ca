"""Input files for predict-files: which files a PATH names, and their rows streamed in bounded memory.

PATH is a file, a folder (every file in it with a known extension, sorted by name) or a glob pattern.
Formats by extension: .csv, .tsv/.tab, .jsonl/.ndjson/.json (one object a line), .parquet/.pq.
CSV/TSV/JSON Lines are read line by line (tasks/tables.py's readers, exact "file:line" locations);
Parquet by record batch (pyarrow's iter_batches, location "file: row N"). A row whose text (or, for
sentence pairs, second text) is missing, empty or unusable (textcheck), or that the reader finds malformed
(an unterminated quote, a line over tables.MAX_LINE_BYTES, JSON nested too deeply), is a bad row: an
error naming file and line, or skipped and counted under `skipping_bad_rows(True)`.
"""
from __future__ import annotations

import glob
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from adalayers.errors import DataError
from adalayers.data.tasks import bad_row
from adalayers.data.tasks.tables import iter_delimited, iter_jsonl
from adalayers.textcheck import text_problem

FORMATS = {".csv": "csv", ".tsv": "tsv", ".tab": "tsv", ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl",
           ".parquet": "parquet", ".pq": "parquet"}


@dataclass(frozen=True)
class Record:
    where: str   # "file:line" (or "file: row N" for Parquet)
    id: str      # the id column's value, as text
    text: str
    text_pair: str | None = None  # the second text of a sentence pair (--text-pair-column)


def input_files(spec: str) -> list[Path]:
    """A file, a folder's files with known extensions, or a glob's matches; sorted, never empty."""
    path = Path(spec).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in FORMATS)
        if not files:
            raise DataError(f"{spec}: no input files in the folder (extensions: {', '.join(FORMATS)})")
        return files
    if path.is_file():
        file_format(path)
        return [path]
    if glob.has_magic(spec):
        files = sorted(Path(p) for p in glob.glob(str(path)) if Path(p).is_file())
        if not files:
            raise DataError(f"{spec}: the pattern matches no files")
        for f in files:
            file_format(f)
        return files
    raise DataError(f"input not found: {spec}")


def file_format(path: Path) -> str:
    try:
        return FORMATS[path.suffix.lower()]
    except KeyError:
        raise DataError(f"{path}: cannot tell the format from the extension; use one of {', '.join(FORMATS)}") from None


def _missing(path: Path, column: str, columns, wanted: tuple[str, ...]) -> DataError:
    options = "--id-column / --text-column" + (" / --text-pair-column" if len(wanted) > 2 else "")
    return DataError(f"{path}: no column {column!r} (columns: {', '.join(map(str, columns))}); "
                     f"name the columns with {options}")


def _rows(path: Path, fmt: str, columns: tuple[str, ...]) -> Iterator[tuple[str, dict]]:
    """(location, {column: value}) for every row of one file, in file order."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            f = pq.ParquetFile(path)
        except Exception as e:  # noqa: BLE001  (pyarrow raises several types for a damaged file)
            raise DataError(f"{path}: not a readable Parquet file ({str(e).splitlines()[0]})") from None
        for c in columns:
            if c not in f.schema_arrow.names:
                raise _missing(path, c, f.schema_arrow.names, columns)
        n = 0
        for batch in f.iter_batches(batch_size=1024, columns=list(dict.fromkeys(columns))):
            for row in batch.to_pylist():
                n += 1
                yield f"{path}: row {n}", row
        return
    rows = iter_jsonl(path) if fmt == "jsonl" else iter_delimited(path, "," if fmt == "csv" else "\t", True)
    checked = fmt == "jsonl"  # JSON objects may each have other keys: checked row by row below
    for where, row in rows:
        if not checked:
            for c in columns:
                if c not in row:
                    raise _missing(path, c, list(row), columns)
            checked = True
        yield where, row


def check_columns(files: list[Path], columns: list[str]) -> None:
    """Each file's header (CSV/TSV first row, Parquet schema) has `columns`: a missing one is named before
    any model loads. JSON objects may differ line by line: their rows are checked as they are read."""
    from adalayers.data.tasks import skipping_bad_rows

    with skipping_bad_rows(True):  # a malformed first row is the job's to report, not this check's
        for path in files:
            fmt = file_format(path)
            if fmt != "jsonl":
                next(_rows(path, fmt, tuple(columns)), None)


def _text_problem(row: dict, column: str, value) -> str | None:
    """Why `value` (row[column]) is not a usable text, or None: textcheck's rule (blank, zero-width only,
    a lone surrogate), the one SideTasks.predict applies, so a bad text is a bad row, not a failed batch."""
    if column not in row:
        return "is missing"
    if value is None:
        return "is empty"
    if not isinstance(value, str):
        return f"is a {type(value).__name__}, not text"
    return text_problem(value)


def records(files: list[Path], id_column: str, text_column: str,
            text_pair_column: str | None = None) -> Iterator[Record]:
    """Every good row of every file, in order; bad rows go to tasks.bad_row (raise, or skip and count).
    With `text_pair_column`, every row is a sentence pair: both texts must be there."""
    columns = (id_column, text_column) + ((text_pair_column,) if text_pair_column else ())
    for path in files:
        for where, row in _rows(path, file_format(path), columns):
            if id_column not in row or row[id_column] is None:
                bad_row(f"{where}: no value in the id column {id_column!r}")
                continue
            if isinstance(row[id_column], (dict, list)):
                bad_row(f"{where}: the id column {id_column!r} holds a {type(row[id_column]).__name__}, not a value")
                continue
            text = row.get(text_column)
            problem = _text_problem(row, text_column, text)
            if problem:
                bad_row(f"{where}: the text column {text_column!r} {problem}")
                continue
            second = row.get(text_pair_column) if text_pair_column else None
            problem = text_pair_column and _text_problem(row, text_pair_column, second)
            if problem:
                bad_row(f"{where}: the second-text column {text_pair_column!r} {problem}")
                continue
            yield Record(where, str(row[id_column]), text, second)
