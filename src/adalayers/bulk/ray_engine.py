"""predict-files on Ray Data: read_* -> map_batches(BatchPredictor actors) -> write_parquet / write_json.

The same job as bulk/local.py, the same model step (BatchPredictor), spread over `concurrency` actors,
each holding its own base and heads (`num_gpus` each). Rows keep the input order (preserve_order) when
the files share one format, so the output equals the local engine's row for row; mixed formats give
the same rows, possibly interleaved. Ray writes its own file names into OUTPUT; a manifest
(complete, rows) is written at the end. Resuming is the local engine's feature: a failed Ray job is run
again whole (Ray itself retries failed tasks and restarts actors).

Without `address`, a local Ray starts on this machine only: node address 127.0.0.1, no dashboard, no
usage stats, `num_cpus` logical CPUs; with it, the job joins that cluster.
"""
from __future__ import annotations

import logging
import time
from dataclasses import asdict
from pathlib import Path

from adalayers.bulk.inputs import check_columns, file_format
from adalayers.bulk.local import MANIFEST, Job, read_manifest
from adalayers.bulk.predictor import BatchPredictor
from adalayers.errors import AdaLayersError, ConfigError, DataError
from adalayers.raylocal import import_ray, init_ray
from adalayers.store.run import write_json

log = logging.getLogger(__name__)


def read_dataset(files: list[Path], job: Job):
    """One Ray dataset over every input file, id and text as the local engine reads them.

    Files of one format are one read (in the local engine's order); mixed formats are a union, whose
    rows Ray may interleave across formats: the same rows, compared by id.
    """
    import itertools

    import pyarrow as pa
    import pyarrow.csv as pacsv
    import ray

    texts = [job.text_column] + ([job.text_pair_column] if job.text_pair_column else [])
    columns = list(dict.fromkeys([job.id_column, *texts]))
    parts = []
    for fmt, group in itertools.groupby(files, key=file_format):
        paths = [str(p) for p in group]
        if fmt == "parquet":
            ds = ray.data.read_parquet(paths)
        elif fmt == "jsonl":  # lines parsed as the local reader does (Ray's own JSON Lines reader, pandas,
            # makes "00012" the number 12 and gives pandas blocks that cannot share a batch with Arrow ones)
            ds = ray.data.read_text(paths, file_extensions=None, include_paths=True).map_batches(
                json_columns, batch_format="pyarrow", fn_kwargs=dict(columns=columns, skip_bad_rows=job.skip_bad_rows))
        else:  # every column as text, as the local CSV reader gives it; TSV unquoted
            parse = pacsv.ParseOptions(delimiter="," if fmt == "csv" else "\t",
                                       quote_char='"' if fmt == "csv" else False,
                                       newlines_in_values=fmt == "csv")
            types = {c: pa.string() for c in columns}
            ds = ray.data.read_csv(paths, parse_options=parse, file_extensions=None,
                                   convert_options=pacsv.ConvertOptions(column_types=types, strings_can_be_null=False,
                                                                        quoted_strings_can_be_null=False))
        parts.append(ds.select_columns(columns))
    return parts[0].union(*parts[1:]) if len(parts) > 1 else parts[0]


def json_columns(batch, columns: list[str], skip_bad_rows: bool):
    """read_text's lines (columns text, path) -> `columns` of each line's JSON object: the id as text
    (str of the JSON value, as the local engine), texts when they are strings (else null: a bad row for
    BatchPredictor). A line that is not a JSON object is a DataError, or dropped with skip_bad_rows."""
    import json

    import pyarrow as pa

    out: dict[str, list] = {c: [] for c in columns}
    for line, path in zip(batch.column("text").to_pylist(), batch.column("path").to_pylist()):
        if not line.strip():
            continue  # a blank line, as the local reader
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            obj, why = None, f"not valid JSON ({e.msg})"
        else:
            why = None if isinstance(obj, dict) else f"expected a JSON object, got {type(obj).__name__}"
        if why:
            if not skip_bad_rows:
                raise DataError(f"{path}: a line is {why}; JSON Lines needs one object per line "
                                f"(use --skip-bad-rows to skip such lines)")
            log.warning("skipped a line of %s: %s", path, why)
            continue
        for i, c in enumerate(columns):
            v = obj.get(c)
            out[c].append((None if v is None else str(v)) if i == 0 else (v if isinstance(v, str) else None))
    return pa.table({c: pa.array(v, pa.string()) for c, v in out.items()})


def run(job: Job, out: Path, batch_size: int = 32, concurrency: int = 2, num_gpus: float = 0,
        cpus_per_actor: float = 0.5, address: str | None = None, num_cpus: int = 2,
        device: str = "auto", num_threads: int | None = 1) -> dict:
    files = job.plan()
    check_columns(files, [job.id_column, job.text_column] + ([job.text_pair_column] if job.text_pair_column else []))
    out = Path(out)
    manifest = read_manifest(out, job)
    if manifest and manifest.get("complete"):
        log.info("%s: already complete (%d rows)", out, manifest["rows"])
        return manifest
    if out.is_dir() and any(out.iterdir()):
        raise DataError(f"{out}: not empty; the Ray engine writes a whole job into an empty --output folder")
    if not address and concurrency * cpus_per_actor >= num_cpus:
        raise ConfigError(f"--concurrency {concurrency} x --cpus-per-actor {cpus_per_actor} takes all {num_cpus} "
                          f"CPUs of the local Ray (--num-cpus); leave some for reading and writing")
    ray = import_ray(local=not address)
    started = init_ray(address, num_cpus)
    start = time.perf_counter()
    try:
        ctx = ray.data.DataContext.get_current()
        ctx.execution_options.preserve_order = True
        ds = read_dataset(files, job)
        # the heads as given: each actor (a process, maybe on another node) resolves a Hub id for itself
        ds = ds.map_batches(BatchPredictor, batch_size=batch_size, batch_format="pyarrow",
                            compute=ray.data.ActorPoolStrategy(size=concurrency),
                            num_gpus=num_gpus, num_cpus=cpus_per_actor,
                            fn_constructor_kwargs=dict(base=job.base, heads=job.heads, id_column=job.id_column,
                                                       text_column=job.text_column,
                                                       text_pair_column=job.text_pair_column, max_length=job.max_length,
                                                       batch_size=batch_size, device=device, num_threads=num_threads,
                                                       skip_bad_rows=job.skip_bad_rows, runtime=job.runtime))
        if job.output_format == "parquet":
            ds.write_parquet(str(out), min_rows_per_file=job.part_rows)
        else:
            ds.write_json(str(out), min_rows_per_file=job.part_rows, force_ascii=False)
    except AdaLayersError:
        raise
    except Exception as e:  # noqa: BLE001  (Ray wraps the actor's error; the user needs its first line)
        cause = e
        while getattr(cause, "cause", None) is not None:
            cause = cause.cause
        if isinstance(cause, AdaLayersError):
            raise type(cause)(str(cause)) from None
        raise DataError(f"the Ray job failed: {str(e).strip().splitlines()[-1]}") from None
    finally:
        if started:
            ray.shutdown()
    import pyarrow.dataset as pads

    written = sorted(p for p in out.iterdir() if p.suffix in (".parquet", ".json", ".jsonl"))
    rows = pads.dataset([str(p) for p in written], format="parquet").count_rows() if job.output_format == "parquet" \
        else sum(1 for p in written for _ in open(p, encoding="utf-8"))
    manifest = {"job": asdict(job), "engine": "ray", "parts": [{"name": p.name} for p in written], "rows": rows,
                "complete": True, "seconds_last_run": round(time.perf_counter() - start, 2)}
    write_json(out / MANIFEST, manifest)
    return manifest
