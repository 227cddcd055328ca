"""predict-files on an IMDB subset: one process against Ray Data with N actors, side by side in one run.

Writes the first --rows reviews of the IMDB test split (alternating pos/neg, in the reader's fixed order)
to a Parquet file with an id column, then runs, one after the other, nice'd:

    adalayers predict-files --engine local --threads T          (one process, T torch threads)
    adalayers predict-files --engine ray --concurrency N         (N actors, 1 torch thread each, local Ray)

and reports for each: rows/s over the job (manifest seconds: model loaded to last part written) and over
the whole command (start-up included), the peak resident memory of the command's process tree (sampled
every 0.2 s; for Ray: driver, Ray's daemons and actors), the machine's 1-minute load average over the
run (min, median, max of the same samples: what else was running), and whether the two outputs agree
row for row (labels and tags exactly, probabilities to 1e-5).

    python benchmarks/bulk_predict.py --heads /work/runs/cola /work/runs/conll --rows 1000
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
from adalayers.store.run import atomic_write, write_json  # noqa: E402
from adalayers.data.tasks.imdb import read_imdb  # noqa: E402
from adalayers.lab.portable import data_setting  # noqa: E402
from adalayers.data.tasks.fetch import data_folder  # noqa: E402


def imdb_subset(data: Path, rows: int, path: Path) -> None:
    test = read_imdb(data / "imdb")[0]["test"]  # sorted: neg reviews, then pos
    half = len(test) // 2
    picked = [test[i // 2 + (half if i % 2 else 0)] for i in range(rows)]
    pq.write_table(pa.table({"id": [f"imdb-test-{i}" for i in range(rows)], "text": [e.text for e in picked]}), path)


def tree_rss_mb(proc: psutil.Process) -> float:
    total = 0
    try:
        procs = [proc, *proc.children(recursive=True)]
    except psutil.Error:  # a child ended while the tree was listed: the next sample counts again
        return 0.0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2**20


def run(cmd: list[str], log: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "RAY_USAGE_STATS_ENABLED": "0"}
    peak, loads, done = [0.0], [], threading.Event()
    t0 = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.Popen(["nice", "-n", "10", *cmd], env=env, stdout=f, stderr=subprocess.STDOUT)
        ps = psutil.Process(proc.pid)

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], tree_rss_mb(ps))
                loads.append(os.getloadavg()[0])
                time.sleep(0.2)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        code = proc.wait()
        done.set()
        sampler.join()
    wall = time.perf_counter() - t0
    if code:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        sys.exit(f"{' '.join(cmd)} failed ({code}); the end of its output:\n{tail}")
    summary = json.loads(log.read_text().strip().splitlines()[-1])
    return {"rows": summary["rows"], "job_seconds": summary["seconds"], "wall_seconds": round(wall, 1),
            "rows_per_s_job": round(summary["rows"] / summary["seconds"], 2),
            "rows_per_s_wall": round(summary["rows"] / wall, 2), "peak_rss_mb": round(peak[0]),
            "load_average_1min": {"min": min(loads), "median": sorted(loads)[len(loads) // 2], "max": max(loads)}}


def compare(a: pa.Table, b: pa.Table) -> dict:
    a, b = a.sort_by("id"), b.sort_by("id")
    out = {"same_ids": a.column("id").equals(b.column("id")), "columns": a.column_names}
    for name in a.column_names:
        x, y = a.column(name).to_pylist(), b.column(name).to_pylist()
        if name.endswith("_score"):
            out[f"{name}_max_abs_diff"] = max(abs(p - q) for p, q in zip(x, y))
        else:
            out[f"{name}_equal"] = x == y
    out["equal"] = out["same_ids"] and all(v for k, v in out.items() if k.endswith("_equal")) and \
        all(v <= 1e-5 for k, v in out.items() if k.endswith("_max_abs_diff"))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="minilm-l6")
    ap.add_argument("--heads", nargs="+", required=True)
    ap.add_argument("--rows", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--threads", type=int, default=2, help="torch threads of the one-process run")
    ap.add_argument("--concurrency", type=int, default=2, help="Ray actors (1 torch thread each)")
    ap.add_argument("--data", default=str(data_folder(None)), help="the data folder (default: $ADALAYERS_DATA, else ../shared/data)")
    ap.add_argument("--out", default="benchmarks/results/bulk_predict")
    args = ap.parse_args()
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    settings.update(data=data_setting(args.data, ROOT), cpus=os.cpu_count(), note="2 shared cores; other jobs ran at the same time")
    print("settings:", json.dumps(settings), flush=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        imdb_subset(Path(args.data), args.rows, tmp / "imdb.parquet")
        common = [sys.executable, "-m", "adalayers.cli", "predict-files", "--base", args.base, "--heads", *args.heads,
                  "--input", str(tmp / "imdb.parquet"), "--batch-size", str(args.batch_size)]
        results = {"local": run(common + ["--output", str(tmp / "local"), "--threads", str(args.threads)],
                                tmp / "local.log")}
        print("local:", results["local"], flush=True)
        results["ray"] = run(common + ["--output", str(tmp / "ray"), "--engine", "ray", "--threads", "1",
                                       "--concurrency", str(args.concurrency)], tmp / "ray.log")
        print("ray:", results["ray"], flush=True)
        check = compare(pq.read_table(tmp / "local"), pq.read_table(tmp / "ray"))
    ratio = results["ray"]["rows_per_s_job"] / results["local"]["rows_per_s_job"]
    write_json(Path(args.out + ".json"), {"settings": settings, "results": results, "ray_over_local_job": ratio,
                                          "outputs": check})
    lines = [f"### predict-files, {args.rows} IMDB test reviews, heads {', '.join(Path(h).name for h in args.heads)}, "
             f"{args.base}, CPU ({os.cpu_count()} shared cores)", "",
             "| engine | rows/s (job) | rows/s (with start-up) | peak memory (process tree) |", "|---|---:|---:|---:|",
             f"| one process, {args.threads} threads | {results['local']['rows_per_s_job']} | "
             f"{results['local']['rows_per_s_wall']} | {results['local']['peak_rss_mb']} MB |",
             f"| Ray Data, {args.concurrency} actors x 1 thread | {results['ray']['rows_per_s_job']} | "
             f"{results['ray']['rows_per_s_wall']} | {results['ray']['peak_rss_mb']} MB |", "",
             "Load average (1 min) during each run, min / median / max: " + "; ".join(
                 f"{k} {v['load_average_1min']['min']:.1f} / {v['load_average_1min']['median']:.1f} / "
                 f"{v['load_average_1min']['max']:.1f}" for k, v in results.items()) + ".", "",
             f"Ray / one process (job rows/s): {ratio:.2f}. Outputs equal row for row: {check['equal']}."]
    atomic_write(Path(args.out + ".md"), "\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if check["equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
