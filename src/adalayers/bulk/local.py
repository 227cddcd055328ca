"""predict-files on one machine: stream the input, predict in batches, write numbered parts, resume after a kill.

OUTPUT is a folder:

    part-00000.parquet ...   PART_ROWS predictions each (the last part fewer), written to a temporary
                             file and renamed, so a part is either whole or absent
    _manifest.json           the job's settings, then after every part: the parts so far and how many
                             input rows they consumed; `complete` once the input is exhausted, with the
                             totals (rows_read = rows + bad_rows, checked)
    _bad_rows.txt            with --skip-bad-rows: every skipped row, "file:line: why", one a line

Resume: a rerun with the same settings re-reads the input without predicting up to the rows the listed
parts consumed, then continues with the next part; a part written after the manifest's last update
(a kill between the two renames) is simply written again. Memory: one part of rows and its predictions.
"""
from __future__ import annotations

import functools
import itertools
import json
import logging
import os
import tempfile
import time
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path

import pyarrow as pa

from adalayers.bulk.inputs import input_files, records
from adalayers import runtimes
from adalayers.bulk.predictor import BatchPredictor, check_heads
from adalayers.store.head_spec import HeadSpec, parse_heads
from adalayers.errors import AdaLayersError, DataError
from adalayers.store.run import atomic_write, write_json
from adalayers.data.tasks import skipping_bad_rows

log = logging.getLogger(__name__)
MANIFEST = "_manifest.json"  # "_": pyarrow and Ray skip it when reading the folder as a dataset
BAD_ROWS = "_bad_rows.txt"    # every skipped row, one "file:line: why" a line
OUTPUT_FORMATS = ("parquet", "jsonl")


@dataclass
class Job:
    """Everything that decides the output; a resumed job must match the manifest's copy."""
    base: str
    heads: list[str]
    input: str
    id_column: str = "id"
    text_column: str = "text"
    text_pair_column: str | None = None  # sentence pairs: the column of each row's second text
    output_format: str = "parquet"
    part_rows: int = 10_000
    max_length: int | None = None
    skip_bad_rows: bool = False
    runtime: str = "torch"  # the engine of the base pass: one of adalayers.runtimes.names(trains=True)
    files: list[dict] = field(default_factory=list)  # [{path, bytes, mtime_ns}], filled by plan()

    @functools.cached_property
    def specs(self) -> list[HeadSpec]:
        """`heads` parsed once (a Hub id resolved once); the manifest keeps them as they were given."""
        return parse_heads(self.heads, "--heads")

    def plan(self) -> list[Path]:
        if self.output_format not in OUTPUT_FORMATS:
            raise DataError(f"--format: one of {', '.join(OUTPUT_FORMATS)}, got {self.output_format!r}")
        if self.part_rows < 1:
            raise DataError(f"--part-rows: must be at least 1, got {self.part_rows}")
        runtimes.get(self.runtime, trains=True)  # an unknown runtime fails before any file is read
        files = input_files(self.input)
        check_heads(self.specs, self.text_pair_column is not None)
        self.files = [{"path": str(p.resolve()), "bytes": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns}
                      for p in files]
        return files


def part_name(i: int, fmt: str) -> str:
    return f"part-{i:05d}.{fmt}"


def write_part(path: Path, table: pa.Table, fmt: str) -> None:
    """Write beside `path`, then rename: a reader (or a resumed job) never sees half a part."""
    import pyarrow.parquet as pq

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        if fmt == "parquet":
            pq.write_table(table, tmp)
        else:
            with open(tmp, "w", encoding="utf-8") as f:
                for row in table.to_pylist():
                    f.write(json.dumps(row, ensure_ascii=False) + "\n")
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_manifest(out: Path, job: Job) -> dict | None:
    path = out / MANIFEST
    if not path.is_file():
        if out.is_dir() and any(out.glob("part-*")):
            raise DataError(f"{out}: holds parts but no {MANIFEST}; choose an empty or new --output folder")
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
        old = manifest["job"]
    except (ValueError, KeyError) as e:
        raise DataError(f"{path}: not a predict-files manifest ({e})") from None
    new = asdict(job)
    defaults = {f.name: f.default for f in fields(Job) if f.default is not MISSING}  # fields added since
    differ = [k for k in new if old.get(k, defaults.get(k)) != new[k]]
    if differ:
        raise DataError(f"{out} holds a job with other settings ({', '.join(differ)} differ); use another --output "
                        f"folder, or delete this one to start over")
    return manifest


def run(job: Job, out: Path, batch_size: int = 32, device: str = "cpu", num_threads: int | None = None,
        predictor: BatchPredictor | None = None) -> dict:
    """Run (or resume) `job` into folder `out`; returns the manifest."""
    from tqdm.auto import tqdm

    files = job.plan()
    out = Path(out)
    manifest = read_manifest(out, job) or {"job": asdict(job), "parts": [], "consumed": 0, "complete": False}
    if manifest["complete"]:
        log.info("%s: already complete (%d rows in %d parts)", out, manifest["rows"], len(manifest["parts"]))
        return manifest
    if manifest["parts"]:
        log.info("resuming %s after part %d (%d input rows done)", out, len(manifest["parts"]) - 1,
                 manifest["consumed"])
    done_rows = sum(p["rows"] for p in manifest["parts"])
    start = time.perf_counter()
    with skipping_bad_rows(job.skip_bad_rows) as skipped:
        stream = records(files, job.id_column, job.text_column, job.text_pair_column)
        first = next(stream, None)  # a missing column fails here, before the model loads
        stream = itertools.chain([first] if first else [], stream)
        seen = 0
        if manifest["consumed"]:  # re-read, without predicting, what the listed parts consumed
            for _ in stream:
                seen += 1
                if seen + len(skipped or []) >= manifest["consumed"]:
                    break
        predictor = predictor or BatchPredictor(job.base, job.specs, device=device, max_length=job.max_length,
                                                batch_size=batch_size, num_threads=num_threads, runtime=job.runtime)
        out.mkdir(parents=True, exist_ok=True)
        bar = tqdm(unit="rows", desc="predict-files", initial=done_rows, dynamic_ncols=True, mininterval=1.0)
        while True:
            chunk = list(itertools.islice(stream, job.part_rows))
            if not chunk:
                break
            table = _predict(predictor, chunk, batch_size, job.text_pair_column is not None, bar)
            seen += len(chunk)
            name = part_name(len(manifest["parts"]), job.output_format)
            write_part(out / name, table, job.output_format)
            manifest["parts"].append({"name": name, "rows": table.num_rows, "first": chunk[0].where,
                                      "last": chunk[-1].where})
            manifest["consumed"] = seen + len(skipped or [])
            write_json(out / MANIFEST, manifest)
        bad = list(skipped or [])
    bar.close()
    return _finish(out, manifest, seen, bad, time.perf_counter() - start)


def _predict(predictor: BatchPredictor, chunk: list, batch_size: int, pairs: bool, bar) -> pa.Table:
    """One part's rows -> its table, batch by batch; a table that lost or gained a row is refused."""
    tables = []
    for s in range(0, len(chunk), batch_size):
        batch = chunk[s: s + batch_size]
        tables.append(predictor.predict([r.id for r in batch], [r.text for r in batch],
                                        [r.text_pair for r in batch] if pairs else None))
        bar.update(len(batch))
    table = pa.concat_tables(tables)
    if table.num_rows != len(chunk):
        raise AdaLayersError(f"rows {chunk[0].where} to {chunk[-1].where}: {len(chunk)} rows in, "
                             f"{table.num_rows} predictions out; nothing of this part was written")
    return table


def _finish(out: Path, manifest: dict, good: int, bad: list[str], seconds: float) -> dict:
    """Check and record the totals: every row read is in the output or in _bad_rows.txt (file:line, why)."""
    written = sum(p["rows"] for p in manifest["parts"])
    totals = {"read": good + len(bad), "written": written, "bad": len(bad)}
    if good != written:
        raise AdaLayersError(f"{out}: the row totals do not add up: {good} good rows read, {written} rows in the "
                             f"parts (was an input file changed while the job ran?); delete the folder to start over")
    atomic_write(out / BAD_ROWS, "".join(m.replace("\n", " ") + "\n" for m in bad))
    manifest.update(complete=True, rows=written, bad_rows=len(bad), rows_read=totals["read"],
                    first_bad_rows=bad[:20], seconds_last_run=round(seconds, 2))
    write_json(out / MANIFEST, manifest)
    for message in bad[:5]:
        log.warning("skipped bad row: %s", message)
    if len(bad) > 5:
        log.warning("... %d bad rows skipped in all (every one in %s)", len(bad), out / BAD_ROWS)
    log.info("rows read: %d = %d written + %d bad%s", totals["read"], written, len(bad),
             f" (listed in {out / BAD_ROWS})" if bad else "")
    return manifest
