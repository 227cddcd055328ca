"""1 process against torchrun with 2 processes (1 thread each) on CoLA: epoch time and test metric, and the
hidden-state cache build time. Writes benchmarks/results/distributed_cola.json and .md.

    python benchmarks/distributed.py --out runs/bench_ddp [--epochs 3] [--train-rows N] [--cache-rows N]

Training reads the hidden-state cache (the default one, built first if missing, outside the timings),
so an epoch is the head's own work: what DDP splits. The cache builds write to OUT/cache-Nproc. Every command runs with nice -n 10, on the loopback
interface (gloo, GLOO_SOCKET_IFNAME=lo, a c10d rendezvous on 127.0.0.1). The two runs of each pair
run one after the other in this one invocation; on a shared machine only their ratio means anything (the
load average at the start and the end is recorded).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def command(nproc: int, args: list[str]) -> list[str]:
    nice = ["nice", "-n", "10"]
    if nproc == 1:
        return nice + [sys.executable, "-m", "adalayers", *args]
    return nice + [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
                   "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--max-restarts", "0",
                   "-m", "adalayers", *args]


def run(nproc: int, args: list[str], log: Path) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo", "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": str(ROOT / "src")}
    cmd = command(nproc, args)
    print("$", " ".join(cmd), flush=True)
    t0 = time.perf_counter()
    with open(log, "w") as f:
        rc = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT).returncode
    if rc:
        sys.exit(f"failed ({rc}); see {log}")
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--config", default=str(ROOT / "configs" / "cola.yaml"))
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--train-rows", type=int, default=None, help="task.max_train_examples for training")
    ap.add_argument("--cache-rows", type=int, default=2000, help="task.max_train_examples for the cache build")
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--two-first", action="store_true", help="run the 2-process runs before the 1-process ones "
                                                             "(to see how much the order, i.e. the machine's load, moves the ratio)")
    ap.add_argument("--name", default="distributed_cola", help="results file name (without extension)")
    a = ap.parse_args()
    load_start = round(os.getloadavg()[0], 2)
    a.out.mkdir(parents=True, exist_ok=True)
    sets = ["--set", "train.num_threads=1", "--set", f"train.max_epochs={a.epochs}",
            "--set", f"train.early_stopping={a.epochs}", "--set", "train.device=cpu"]
    if a.train_rows:
        sets += ["--set", f"task.max_train_examples={a.train_rows}"]
    run(1, ["cache", "build", a.config, *sets], a.out / "cache-train.log")  # outside the timings

    order = (2, 1) if a.two_first else (1, 2)
    train = {}
    for n in order:
        out = a.out / f"train-{n}proc"
        run(n, ["train", a.config, "--out", str(out), *sets], a.out / f"train-{n}proc.log")
        log = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
        metrics = json.loads((out / "metrics.json").read_text())
        train[n] = {"epoch_seconds": [e["seconds"] for e in log],
                    "median_epoch_seconds": statistics.median(e["seconds"] for e in log),
                    "test": {k: metrics["test"][k] for k in ("mcc", "accuracy")},
                    "validation": {k: metrics["validation"][k] for k in ("mcc", "accuracy")}}

    cache = {}
    csets = ["--set", "train.num_threads=1", "--set", "train.device=cpu",
             "--set", f"task.max_train_examples={a.cache_rows}"]
    for n in order:
        cache[n] = round(run(n, ["cache", "build", a.config, *csets, "--set", f"cache.dir={a.out / f'cache-{n}proc'}"],
                             a.out / f"cache-{n}proc.log"), 2)

    result = {
        "settings": {"config": os.path.relpath(a.config, ROOT), "epochs": a.epochs, "order": list(order), "train_rows": a.train_rows or "all",
                     "cache_rows": a.cache_rows, "threads_per_process": 1, "nice": 10, "backend": "gloo (CPU)",
                     "cpu_count": os.cpu_count(), "machine": platform.platform(),
                     "load_average_1min": {"start": load_start, "end": round(os.getloadavg()[0], 2)},
                     "note": "ratios of runs made one after the other; the load average says how busy the machine was"},
        "train": {f"{n}proc": v for n, v in train.items()},
        "epoch_time_ratio_1proc_over_2proc": round(train[1]["median_epoch_seconds"] / train[2]["median_epoch_seconds"], 3),
        "test_mcc_difference_2proc_minus_1proc": round(train[2]["test"]["mcc"] - train[1]["test"]["mcc"], 4),
        "cache_build_seconds": {f"{n}proc": s for n, s in cache.items()},
        "cache_build_ratio_1proc_over_2proc": round(cache[1] / cache[2], 3),
    }
    a.results.mkdir(parents=True, exist_ok=True)
    (a.results / f"{a.name}.json").write_text(json.dumps(result, indent=2) + "\n")
    t1, t2 = train[1], train[2]
    md = [f"CoLA, {a.epochs} epochs from the hidden-state cache ({a.train_rows or 'all'} training rows), 1 thread per "
          f"process, nice 10, load average {load_start} at the start; run order {order}",
          "", "| | 1 process | torchrun, 2 processes | ratio 1/2 |", "|---|---|---|---|",
          f"| median epoch (s) | {t1['median_epoch_seconds']:.1f} | {t2['median_epoch_seconds']:.1f} | "
          f"{result['epoch_time_ratio_1proc_over_2proc']:.2f} |",
          f"| test MCC | {t1['test']['mcc']:.3f} | {t2['test']['mcc']:.3f} | |",
          f"| cache build, {a.cache_rows} training rows + dev (s) | {cache[1]:.1f} | {cache[2]:.1f} | "
          f"{result['cache_build_ratio_1proc_over_2proc']:.2f} |", ""]
    (a.results / f"{a.name}.md").write_text("\n".join(md))
    print("\n".join(md))


if __name__ == "__main__":
    main()
