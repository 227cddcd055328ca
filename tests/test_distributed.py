"""Training across processes: real torchrun, 2 processes, gloo on the loopback interface.

One process and two processes train the same global batches (dropout off, so the only difference
is the order of float sums): the per-epoch training losses agree to 1e-4 and the validation and
test metrics to 0.02. The 2-process run is killed (rank 1, SIGKILL) after its first epoch and
resumed by the same command; the run folder is then complete and every file written once.
Retraining a finished run with --overwrite under torchrun: rank 0 alone makes the new folder and
swaps it in, the other rank builds into that same folder, and one run folder results.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from conftest import ROOT, tiny_model, tiny_tokenizer
from test_resume import write_fake_cola

LOSS_TOL, METRIC_TOL = 1e-4, 0.02
# the tests that compare no metrics train on 160 rows (10 steps an epoch): what they check is the run folder
FEW = ("--set", "task.max_train_examples=160")

# a finished run folder: the head, its log and metrics, the probe beside it and which of the two was kept
RUN_FILES = ["candidates", "config.json", "head.safetensors", "log.jsonl", "metrics.json", "selection.json",
             "selection.md"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(cfg: Path, out: Path, env: dict, nproc: int = 2, nodes: int = 1, port: int | None = None,
             log_name: str = "", extra: tuple = ()) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--nproc-per-node", str(nproc),
           "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port or free_port()}", "--rdzv-id", out.name,
           "--max-restarts", "0", "-m", "adalayers", "train", str(cfg), "--out", str(out), *extra]
    log = open(f"{out}{log_name}.out", "a+")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    proc.output = lambda: (log.seek(0), log.read())[1]
    return proc


def rank_pid(parent: int, rank: int, timeout: float = 120) -> int:
    """The pid of the worker torchrun started with RANK=rank."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for d in Path("/proc").iterdir():
            if not d.name.isdigit():
                continue
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
                if ppid == parent and f"RANK={rank}".encode() in (d / "environ").read_bytes().split(b"\0"):
                    return int(d.name)
            except (OSError, IndexError, ValueError):
                continue
        time.sleep(0.05)
    raise AssertionError(f"torchrun {parent} started no rank {rank}")


@pytest.fixture
def setup(tmp_path):
    from adalayers import config

    model_dir = tmp_path / "tiny-bert"
    tiny_model("bert", len(tiny_tokenizer())).save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    write_fake_cola(tmp_path / "data" / "glue" / "CoLA", 800, seed=1)
    cfg = {"task": {"name": "cola", "data_dir": str(tmp_path / "data")},
           "model": {"base": str(model_dir), "max_length": 16},
           "mixer": {"k": 8, "dropout": 0.0}, "head": {"num_heads": 2, "dropout": 0.0},
           "train": {"lr": 3e-3, "batch_size": 16, "max_epochs": 3, "early_stopping": 5, "seed": 3,
                     "num_threads": 1, "device": "cpu"},
           "cache": {"enabled": False}}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "ADALAYERS_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT / "src"),
           "GLOO_SOCKET_IFNAME": "lo", "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    return tmp_path, path, config.load(path), env


def test_two_processes_match_one_and_resume_after_rank_1_is_killed(setup, monkeypatch):
    from adalayers.recipes import service

    tmp, cfg_path, cfg, env = setup
    monkeypatch.setenv("ADALAYERS_CACHE", env["ADALAYERS_CACHE"])

    victim = torchrun(cfg_path, tmp / "two", env)
    log = tmp / "two" / "log.jsonl"
    rank1 = rank_pid(victim.pid, 1)
    deadline = time.time() + 300
    while time.time() < deadline and victim.poll() is None and not (log.is_file() and log.read_text().strip()):
        time.sleep(0.005)
    os.kill(rank1, signal.SIGKILL)
    assert victim.wait(timeout=120) != 0, victim.output()
    assert not (tmp / "two" / "metrics.json").exists(), "the run finished before rank 1 could be killed"

    resumed = torchrun(cfg_path, tmp / "two", env)  # the same command: an unfinished run folder resumes
    one = service.train(cfg, tmp / "one")  # one process, in this one (while the resumed run trains: no file shared)
    assert resumed.wait(timeout=600) == 0, resumed.output()
    out = resumed.output()
    assert "resuming" in out and out.count('"trainable_params"') == 1  # rank 0 alone reports

    files = sorted(p.name for p in (tmp / "two").iterdir())
    assert files == RUN_FILES, files
    two = json.loads((tmp / "two" / "metrics.json").read_text())
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    ref = [json.loads(line) for line in (tmp / "one" / "log.jsonl").read_text().splitlines()]
    assert [e["epoch"] for e in lines] == [1, 2, 3]  # each epoch logged once, by one process
    for a, b in zip(ref, lines):
        assert b["train_loss"] == pytest.approx(a["train_loss"], rel=LOSS_TOL), (a, b)
    for split in ("validation", "test"):
        for metric in ("accuracy", "mcc"):
            assert abs(two[split][metric] - one[split][metric]) <= METRIC_TOL, (split, metric, one, two)


def test_two_nodes_through_a_c10d_rendezvous_write_one_complete_run_folder(setup):
    """Multi-node as torchrun does it: two launchers (two "nodes", one process each) meet at one c10d
    rendezvous endpoint (here 127.0.0.1; across machines, a host all of them reach) and train together."""
    tmp, cfg_path, _, env = setup
    port, out = free_port(), tmp / "nodes"
    nodes = [torchrun(cfg_path, out, env, nproc=1, nodes=2, port=port, log_name=f"-node{n}",
                      extra=("--set", "train.max_epochs=2", *FEW)) for n in range(2)]
    for node in nodes:
        assert node.wait(timeout=600) == 0, node.output()
    outputs = "".join(node.output() for node in nodes)
    assert "process 0 of 2 joined" in outputs and outputs.count('"trainable_params"') == 1  # rank 0 reports
    assert sorted(p.name for p in out.iterdir()) == RUN_FILES
    lines = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [e["epoch"] for e in lines] == [1, 2]  # each epoch logged once, by one process
    assert {"validation", "test"} <= set(json.loads((out / "metrics.json").read_text()))


@pytest.mark.parametrize("argv, name", [(["compare", "cfg.yaml", "--out", "x"], "compare"),
                                        (["compare-multitask", "mt.yaml", "--out", "x"], "compare-multitask"),
                                        (["cache", "ls"], "cache ls")])
@pytest.mark.parametrize("rank", [0, 1])
def test_commands_that_do_not_run_under_torchrun_say_so_in_one_line(argv, name, rank, monkeypatch, capsys, tmp_path):
    """What torchrun sets (WORLD_SIZE, RANK): compare and compare-multitask run each strategy in a process of
    its own and time inference in one, so they stop at once, rank 0 saying why, before any file is written."""
    from adalayers import cli

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", str(rank))
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err == ("" if rank else f"error: 'adalayers {name}' does not run under torchrun; under torchrun: train, "
                                   f"sweep-layers, cache build (launch this one without torchrun)\n")
    assert list(tmp_path.iterdir()) == []


def test_overwrite_under_torchrun_builds_one_new_run_and_swaps_it_in_once(setup, monkeypatch):
    from adalayers.recipes import service

    tmp, cfg_path, cfg, env = setup
    monkeypatch.setenv("ADALAYERS_CACHE", env["ADALAYERS_CACHE"])
    cfg.train.max_epochs, cfg.task.max_train_examples = 1, 160
    service.train(cfg, tmp / "run")  # a finished run, made by one process
    old = json.loads((tmp / "run" / "metrics.json").read_text())

    refused = torchrun(cfg_path, tmp / "run", env, extra=("--set", "train.max_epochs=2", *FEW))
    assert refused.wait(timeout=300) != 0
    assert "give --overwrite" in refused.output()
    assert json.loads((tmp / "run" / "metrics.json").read_text()) == old  # refused: untouched

    again = torchrun(cfg_path, tmp / "run", env, extra=("--set", "train.max_epochs=2", *FEW, "--overwrite"))
    assert again.wait(timeout=600) == 0, again.output()
    assert again.output().count('"trainable_params"') == 1  # rank 0 alone reports
    assert sorted(p.name for p in tmp.iterdir() if p.name.startswith(".run.")) == []  # no new-/old- folder left
    files = sorted(p.name for p in (tmp / "run").iterdir())
    assert files == RUN_FILES, files
    new = json.loads((tmp / "run" / "metrics.json").read_text())
    assert (old["epochs"], new["epochs"]) == (1, 2)
    assert [json.loads(line)["epoch"] for line in (tmp / "run" / "log.jsonl").read_text().splitlines()] == [1, 2]
