"""A run killed with SIGKILL in the middle of an epoch resumes to exactly the uninterrupted result."""
import json
import os
import random
import signal
import subprocess
import sys
import time

import pytest
import yaml
from safetensors.torch import load_file

from conftest import ROOT, WORDS, tiny_model, tiny_tokenizer


def write_fake_cola(folder, n, seed):
    rng = random.Random(seed)
    folder.mkdir(parents=True)
    for name, rows in (("train.tsv", n), ("dev.tsv", n // 4)):
        lines = []
        for _ in range(rows):
            words = rng.choices(WORDS, k=rng.randint(3, 12))
            label = int("good" in words or "great" in words or rng.random() < 0.2)
            lines.append(f"src\t{label}\t\t{' '.join(words)}")
        (folder / name).write_text("\n".join(lines) + "\n")


@pytest.fixture
def setup(tmp_path):
    model_dir = tmp_path / "tiny-bert"
    tiny_model("bert", len(tiny_tokenizer())).save_pretrained(model_dir)
    tiny_tokenizer().save_pretrained(model_dir)
    write_fake_cola(tmp_path / "data" / "glue" / "CoLA", 640, seed=1)  # 36 steps an epoch: a kill lands mid-run
    cfg = {"task": {"name": "cola", "data_dir": str(tmp_path / "data")},
           "model": {"base": str(model_dir), "max_length": 16},
           "mixer": {"k": 8}, "head": {"num_heads": 2},
           "train": {"lr": 3e-3, "batch_size": 16, "max_epochs": 5, "early_stopping": 5, "seed": 3,
                     "num_threads": 1},
           "cache": {"enabled": False}}
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    env = {**os.environ, "ADALAYERS_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT / "src")}
    return tmp_path, path, env


def train(cfg, out, env, *extra):
    """Start `adalayers train`; its output goes to a file (a full pipe would block the child)."""
    log = open(f"{out}.out", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "adalayers.cli", "train", str(cfg), "--out", str(out), *extra],
                            env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
    proc.output = lambda: (log.seek(0), log.read())[1]
    return proc


def in_process(cfg, out, env, monkeypatch, *extra) -> int:
    """`adalayers train` in this process (cli.main, no new interpreter): for runs that are refused or short."""
    from adalayers.cli import main

    monkeypatch.setenv("ADALAYERS_CACHE", env["ADALAYERS_CACHE"])
    return main(["train", str(cfg), "--out", str(out), *extra])


def test_sigkill_then_resume_equals_uninterrupted_run(setup, monkeypatch, capsys):
    """The uninterrupted and the killed run in processes of their own; the resumed one in this process."""
    tmp, cfg, env = setup
    full = train(cfg, tmp / "full", env)  # the uninterrupted run, beside the one killed (one thread each)
    victim = train(cfg, tmp / "killed", env)
    log = tmp / "killed" / "log.jsonl"
    deadline = time.time() + 600
    while time.time() < deadline and victim.poll() is None:
        if log.is_file() and len(log.read_text().splitlines()) >= 2:
            time.sleep(0.05)  # into epoch 3
            break
        time.sleep(0.005)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert not (tmp / "killed" / "metrics.json").exists(), "the run finished before it could be killed"

    capsys.readouterr()
    resumed = in_process(cfg, tmp / "killed", env, monkeypatch)  # no flag: an unfinished run folder resumes by itself
    err = capsys.readouterr().err
    assert resumed == 0, err
    assert full.wait(timeout=600) == 0, full.output()
    assert "resuming" in err

    a, b = load_file(tmp / "full" / "head.safetensors"), load_file(tmp / "killed" / "head.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    ma, mb = (json.loads((tmp / r / "metrics.json").read_text()) for r in ("full", "killed"))
    assert ma["test"] == mb["test"] and ma["validation"] == mb["validation"]
    la, lb = ((tmp / r / "log.jsonl").read_text().splitlines() for r in ("full", "killed"))
    strip = lambda lines: [{k: v for k, v in json.loads(l).items() if k != "seconds"} for l in lines]
    assert strip(la) == strip(lb)


def test_resume_flag_without_unfinished_run_is_an_error(setup, monkeypatch, capsys):
    tmp, cfg, env = setup
    assert in_process(cfg, tmp / "nothing", env, monkeypatch, "--resume") == 2
    assert "holds no unfinished run" in capsys.readouterr().err


def test_nan_loss_stops_and_keeps_the_best_checkpoint(setup, monkeypatch):
    """A loss that turns NaN stops training with the step named; the last good head stays loadable."""
    import math

    import torch

    from adalayers import config
    from adalayers.recipes import service
    from adalayers.store import run as runlib
    from adalayers.model.sidetask import SideTask
    from adalayers.recipes.train import TrainingError

    tmp, cfg_path, env = setup
    monkeypatch.setenv("ADALAYERS_CACHE", env["ADALAYERS_CACHE"])
    cfg = config.load(cfg_path, ["task.max_train_examples=200", "train.max_epochs=3"])
    real_loss, calls = SideTask.loss, {"n": 0}

    def loss_then_nan(self, logits, labels):
        calls["n"] += 1
        value = real_loss(self, logits, labels)
        return value * math.nan if calls["n"] > 20 else value   # 13 steps per epoch: NaN in epoch 2

    monkeypatch.setattr(SideTask, "loss", loss_then_nan)
    with pytest.raises(TrainingError, match=r"loss became nan at step 21 \(epoch 2\).*epoch 1"):
        service.train(cfg, tmp / "nan")
    task, _, _ = runlib.load_head(tmp / "nan")
    assert all(torch.isfinite(p).all() for p in task.parameters())


def test_resume_may_change_only_when_to_stop(setup, monkeypatch, capsys):
    """An interrupted run can be finished with fewer epochs or extended; other changes are refused. The run is
    killed in a process of its own; the refused and the finishing command run in this one (cli.main)."""
    tmp, cfg, env = setup
    victim = train(cfg, tmp / "run", env, "--set", "task.max_train_examples=200")
    log = tmp / "run" / "log.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and victim.poll() is None and not (log.is_file() and log.read_text().count("\n") >= 2):
        time.sleep(0.005)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert not (tmp / "run" / "metrics.json").exists()
    capsys.readouterr()
    assert in_process(cfg, tmp / "run", env, monkeypatch, "--set", "task.max_train_examples=200",
                      "--set", "train.lr=0.01") == 2
    assert "different settings" in capsys.readouterr().err
    done = len(log.read_text().splitlines())
    assert in_process(cfg, tmp / "run", env, monkeypatch, "--set", "task.max_train_examples=200",
                      "--set", f"train.max_epochs={done}") == 0, capsys.readouterr().err
    assert "resuming" in capsys.readouterr().err
    assert json.loads((tmp / "run" / "metrics.json").read_text())["epochs"] == done
