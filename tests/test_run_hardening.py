"""Run folders edited by a careless user or an attacker: config.json against its schema, mandatory checksums,
finite weights, file modes from the umask, arguments that are not UTF-8."""
from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from adalayers import cli
from adalayers.store import run as runlib
from adalayers.errors import DataError, ModelError, RunError
from adalayers.store.trust import trusting

from conftest import tiny_backbone
from runs_util import make_run


@pytest.fixture()
def base(tokenizer):
    return tiny_backbone("bert", tokenizer)


@pytest.fixture()
def run(base, tmp_path):
    return make_run(tmp_path / "acc", base, "sequence", ["bad", "good"], seed=3)


def _edit(run, change, seal: bool = True) -> None:
    """Edit config.json; `seal`: with its own checksum recomputed (to reach the checks behind it)."""
    path = run / "config.json"
    meta = json.loads(path.read_text())
    change(meta)
    if seal:
        runlib.write_config(run, meta)
    else:
        path.write_text(json.dumps(meta))


def test_a_run_without_checksums_is_refused(run, base):
    _edit(run, lambda m: m.pop("checksums"), seal=False)
    with pytest.raises(RunError, match="checksums: Field required"):
        runlib.load_head(run, base)
    _edit(run, lambda m: m.update(checksums={}), seal=False)
    with pytest.raises(RunError, match="no sha256 of head.safetensors"):
        runlib.load_head(run, base)


def test_non_finite_weights_are_refused_even_with_a_matching_checksum(run, base):
    state = load_file(run / runlib.HEAD)
    name = next(k for k, v in state.items() if v.is_floating_point())
    state[name] = torch.full_like(state[name], float("nan"))
    save_file(state, run / runlib.HEAD)
    _edit(run, lambda m: m["checksums"].update({runlib.HEAD: runlib.sha256(run / runlib.HEAD)}))
    with pytest.raises(RunError, match=f"not finite .* in {name}"):
        runlib.load_head(run, base)


@pytest.mark.parametrize("change, says", [
    (lambda m: m.update(base=[]), "base: Input should be a valid dictionary"),
    (lambda m: m["base"].pop("fingerprint"), "base.fingerprint: Field required"),
    (lambda m: m.update(checksums=[]), "checksums: Input should be a valid dictionary"),
    (lambda m: m["base"].update(hidden_size="x"), "base.hidden_size: Input should be a valid integer"),
    (lambda m: m.update(labels="ab"), "labels: Input should be a valid list"),
    (lambda m: m.update(labels=["a", "a"]), "labels are not distinct"),
    (lambda m: m.update(labels=["a"]), "needs at least 2 labels"),
    (lambda m: m.update(config=7), "config: Input should be a valid dictionary"),
])
def test_config_json_of_the_wrong_shape_is_one_line(run, base, change, says, capsys):
    _edit(run, change, seal=False)  # the shape is checked before the checksum
    with pytest.raises(RunError, match=says):
        runlib.load_head(run, base)
    assert cli.main(["predict", str(run), "a good movie"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and "config.json: not a valid run config" in err


@pytest.mark.parametrize("change", [lambda m: m["labels"].reverse(),
                                    lambda m: m["config"]["task"].update(template="Review: {text}"),
                                    lambda m: m["config"]["mixer"].update(cutoff=0.2),
                                    lambda m: m["config"]["head"].update(pooling="max")])
def test_an_edited_config_json_is_refused(run, base, change, capsys, caplog):
    assert runlib.load_head(run, base)[2]["labels"] == ["bad", "good"]
    _edit(run, change, seal=False)
    with pytest.raises(RunError, match="does not match its checksum"):
        runlib.load_head(run, base)
    assert cli.main(["predict", str(run), "a good movie"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config.json: its content does not match its checksum" in err


def test_a_run_without_the_config_checksum_is_refused_unless_trusted(run, base, caplog):
    _edit(run, lambda m: m["checksums"].pop(runlib.CONFIG), seal=False)
    with pytest.raises(ModelError, match=r"config.json: its checksums have no \"config.json\" entry"):
        runlib.load_head(run, base)
    with caplog.at_level("WARNING", logger="adalayers.store.trust"), trusting():
        runlib.load_head(run, base)
    said = [r.getMessage() for r in caplog.records if "loaded unchecked" in r.getMessage()]
    assert len(said) == 1 and str(run / "config.json") in said[0]


@pytest.mark.parametrize("change, says", [
    (lambda m: m["config"]["mixer"].update(k=2_000_000), "mixer.k: must be at most 8192, got 2000000"),
    (lambda m: m["config"]["mixer"].update(k=10 ** 12), "mixer.k: must be at most 8192"),
    (lambda m: m["config"]["mixer"].update(alpha=float("nan")), "mixer.alpha: must be a finite number, got nan"),
    (lambda m: m["config"]["head"].update(dim_feedforward=10 ** 9), "head.dim_feedforward: must be at most 65536"),
])
def test_config_values_are_bounded_on_load(run, base, change, says, capsys):
    _edit(run, change)
    with pytest.raises(RunError, match=says):
        runlib.load_head(run, base)
    assert cli.main(["predict", str(run), "a good movie"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ")


@pytest.mark.parametrize("depth", [500, 100_000])
def test_a_deeply_nested_config_json_is_one_line(run, base, depth, capsys):
    text = (run / "config.json").read_text()
    assert '"options": {}' in text
    (run / "config.json").write_text(text.replace('"options": {}', '"options": ' + "[" * depth + "]" * depth))
    with pytest.raises(RunError, match="not a valid run config \\(nested"):
        runlib.load_head(run, base)
    assert cli.main(["predict", str(run), "a good movie"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_predict_file_that_is_not_utf8_is_one_line(run, tmp_path, capsys):
    path = tmp_path / "texts.txt"
    path.write_bytes(b"a good movie\n\nbad \xff\xfe bytes\n")
    assert cli.main(["predict", str(run), "--file", str(path)]) == 2
    assert capsys.readouterr().err == f"error: {path}:3: not valid UTF-8 (invalid start byte); save the file as UTF-8\n"


def test_a_json_list_is_not_a_run_config(run):
    (run / "config.json").write_text("[]")
    with pytest.raises(RunError, match="a JSON object is expected"):
        runlib.read_config(run)


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_run_files_respect_the_umask(base, tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        run = make_run(tmp_path / "acc", base, "sequence", ["bad", "good"], seed=3)
        runlib.append_jsonl(run / "log.jsonl", {"epoch": 1})
    finally:
        os.umask(old)
    for name in ("config.json", runlib.HEAD, "log.jsonl"):
        assert stat.S_IMODE((run / name).stat().st_mode) == mode, name


def test_an_argument_that_is_not_utf8_is_one_line(run, capsys):
    text = os.fsdecode(b"caf\xff")  # what Python makes of the bytes of a non-UTF-8 argument
    assert cli.main(["predict", str(run), text]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "text 1 is not valid Unicode" in err


# --- 12. data a classifier or a regression cannot learn from --------------------------------------------------
def _task(tmp_path, header: str, rows: list[str], **task):
    from adalayers import config
    from adalayers.data.tasks import load_task

    path = tmp_path / "train.csv"
    path.write_text("\n".join([header, *rows]) + "\n", encoding="utf-8")
    return load_task(config.from_dict({"task": {"train": str(path), **task}}))


def test_a_single_class_is_refused(tmp_path):
    rows = [f"text number {i},pos" for i in range(40)]
    with pytest.raises(DataError, match="every training example has the label 'pos'; a classifier needs at least two"):
        _task(tmp_path, "text,label", rows)
    assert _task(tmp_path, "text,label", rows[:-1] + ["text number 99,neg"]).labels == ["neg", "pos"]


def test_a_duplicated_header_column_is_refused(tmp_path):
    rows = [f"text number {i},{'pos' if i % 2 else 'neg'},x" for i in range(40)]
    with pytest.raises(DataError, match=r"train.csv:1: column 'label' appears more than once"):
        _task(tmp_path, "text,label,label", rows)


@pytest.mark.parametrize("bad", ["nan", "inf", "-Infinity", "1e999"])
def test_non_finite_regression_labels_are_refused_when_read(tmp_path, bad):
    rows = [f"text number {i},{i / 7:.3f}" for i in range(40)] + [f"the last text,{bad}"]
    with pytest.raises(DataError, match=rf"train.csv:42: label '{bad}' is not a finite number"):
        _task(tmp_path, "text,score", rows, label="score", kind="regression")


# --- a trained run: overwrite rule, evaluate on a read-only folder, the cache folder, moved runs ------------------
def _rows(n: int, seed: int) -> str:
    import random

    rng = random.Random(seed)
    words = "the a movie film plot actor scene story it was is quite".split()
    lines = ["text,label"]
    for i in range(n):
        good = i % 2 == 0
        lines.append(" ".join(rng.sample(words, 4) + ["great" if good else "awful"]) + ("," + ("pos" if good else "neg")))
    return "\n".join(lines) + "\n"


def _cfg(base, train_file: str, test_file: str, **sections):
    from adalayers import config

    data = {"task": {"train": train_file, "test": test_file}, "model": {"base": str(base), "max_length": 24},
            "mixer": {"k": 8}, "head": {"num_heads": 2, "dim_feedforward": 16},
            "train": {"max_epochs": 1, "batch_size": 16, "num_threads": 1, "device": "cpu", "lr": 1e-2},
            "cache": {"enabled": False}}
    for section, values in sections.items():
        data[section].update(values)
    return config.from_dict(data)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished run, trained with data paths relative to the folder training ran in."""
    from adalayers.recipes import service
    from tinymodels import tiny_bert

    root = tmp_path_factory.mktemp("trained")
    base = tiny_bert(root / "tiny-bert")
    (root / "data").mkdir()
    (root / "data" / "train.csv").write_text(_rows(160, 1))
    (root / "data" / "test.csv").write_text(_rows(40, 2))
    cwd = os.getcwd()
    os.chdir(root)
    try:
        service.train(_cfg(base, "data/train.csv", "data/test.csv"), root / "run")
    finally:
        os.chdir(cwd)
    return {"root": root, "base": base, "run": root / "run",
            "cfg": lambda **kw: _cfg(base, str(root / "data" / "train.csv"), str(root / "data" / "test.csv"), **kw)}


def _files(folder) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_finished_run_is_refused_without_overwrite_and_swapped_whole_with_it(trained, tmp_path):
    import shutil

    from adalayers.recipes import service

    run = tmp_path / "acc"
    shutil.copytree(trained["run"], run)
    before = _files(run)
    with pytest.raises(RunError, match="holds a finished run .* give --overwrite"):
        service.train(trained["cfg"](train={"lr": 3e-4}), run)
    assert _files(run) == before
    broken = trained["cfg"]()
    broken.task.files.train = str(tmp_path / "missing.csv")  # the new run fails while being built
    with pytest.raises(Exception, match="missing.csv"):
        service.train(broken, run, overwrite=True)
    assert _files(run) == before and sorted(p.name for p in tmp_path.iterdir()) == ["acc"]
    metrics = service.train(trained["cfg"](train={"lr": 3e-4}), run, overwrite=True)
    assert json.loads((run / "metrics.json").read_text()) == json.loads(json.dumps(metrics))
    assert json.loads((run / "config.json").read_text())["config"]["train"]["lr"] == 3e-4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["acc"]  # no temporary folder left


def test_a_killed_overwrite_leaves_the_old_run_intact(trained, tmp_path):
    import shutil
    import signal
    import subprocess
    import sys
    import time

    import yaml

    run = tmp_path / "acc"
    shutil.copytree(trained["run"], run)
    before = _files(run)
    cfg = trained["cfg"](train={"max_epochs": 50, "lr": 3e-4})
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg.to_dict()))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    proc = subprocess.Popen([sys.executable, "-m", "adalayers.cli", "train", str(tmp_path / "cfg.yaml"), "--out",
                             str(run), "--overwrite"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not any((p / "log.jsonl").is_file() for p in tmp_path.glob(".acc.new-*")):  # inside the new run
        assert time.time() < deadline and proc.poll() is None
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _files(run) == before  # the finished run, untouched; the half-built one lies beside it
    leftover = list(tmp_path.glob(".acc.new-*"))
    assert len(leftover) == 1
    # the next start removes it (its process is gone), then overwrites as usual
    from adalayers.recipes import service

    service.train(trained["cfg"](train={"lr": 3e-4}), run, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["acc", "cfg.yaml"]
    assert ".owner" not in _files(run)


def test_leftovers_of_an_interrupted_swap_are_restored_or_removed(trained, tmp_path, caplog):
    import shutil

    run = tmp_path / "acc"
    shutil.copytree(trained["run"], run)
    before = _files(run)
    run.rename(tmp_path / ".acc.old-x1")  # killed between the two renames: the old run is the only one
    (tmp_path / ".acc.new-x1").mkdir()  # and the new one half built, by a process long gone
    (tmp_path / ".acc.new-x1" / ".owner").write_text("elsewhere-but-not-really 1\n")
    (tmp_path / ".acc.new-x2").mkdir()  # one being built right now, by this very process
    (tmp_path / ".acc.new-x2" / ".owner").write_text(f"{socket.gethostname()} {os.getpid()}\n")
    with caplog.at_level("WARNING", logger="adalayers.store.run"):
        runlib.clean_leftovers(run)
    assert _files(run) == before and "restoring" in caplog.text
    assert sorted(p.name for p in tmp_path.iterdir()) == [".acc.new-x1", ".acc.new-x2", "acc"]  # other host's: kept
    (tmp_path / ".acc.new-x1" / ".owner").write_text(f"{socket.gethostname()} 999999999\n")
    shutil.copytree(run, tmp_path / ".acc.old-x3")  # the swap had finished: the old copy is garbage
    runlib.clean_leftovers(run)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".acc.new-x2", "acc"]


def test_evaluate_on_a_folder_it_cannot_write_prints_the_metrics_and_fails(trained, tmp_path):
    import resource
    import shutil
    import subprocess
    import sys

    run = tmp_path / "acc"
    shutil.copytree(trained["run"], run)
    before = _files(run)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src"), "PYTHONDONTWRITEBYTECODE": "1"}
    os.chmod(run, 0o555)  # read-only (root ignores it: the file size limit below stops its writes instead)
    try:
        p = subprocess.run([sys.executable, "-m", "adalayers.cli", "evaluate", str(run)], env=env,
                           capture_output=True, text=True, timeout=300,
                           preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0)))
    finally:
        os.chmod(run, 0o755)
    assert p.returncode == 2, p.stderr
    assert json.loads(p.stdout)["n"] == 40  # the metrics were printed
    assert p.stderr.strip().splitlines()[-1].startswith(f"error: {run / 'eval_test.json'}: could not be written")
    assert "Traceback" not in p.stderr
    assert _files(run) == before  # nothing half-written


def test_a_moved_run_evaluates_from_another_folder(trained, tmp_path, monkeypatch, capsys):
    import shutil

    from adalayers import cli

    moved = tmp_path / "elsewhere" / "acc"
    shutil.copytree(trained["run"], moved)
    monkeypatch.chdir(tmp_path)  # data/train.csv is not here: config.json's "data" says where it was
    assert json.loads((moved / "config.json").read_text())["data"]["test"] == str(trained["root"] / "data" / "test.csv")
    assert cli.main(["evaluate", str(moved)]) == 0
    assert json.loads(capsys.readouterr().out)["n"] == 40


def test_a_cache_folder_that_is_a_file_is_one_line(trained, tmp_path, monkeypatch):
    from adalayers.recipes import service
    from adalayers.errors import AdaLayersError

    (tmp_path / "not-a-folder").write_text("x")
    monkeypatch.setenv("ADALAYERS_CACHE", str(tmp_path / "not-a-folder"))
    with pytest.raises(AdaLayersError, match="not-a-folder is a file, not a folder"):
        service.train(trained["cfg"](cache={"enabled": True}), tmp_path / "run")


def test_a_cache_folder_that_cannot_be_written_falls_back_to_the_live_base(trained, tmp_path, monkeypatch, caplog):
    from adalayers.recipes import service

    ro = Path("/sys/adalayers-cache")  # sysfs: no one may create a folder there, root included
    if not Path("/sys").is_dir():
        pytest.skip("no /sys")
    monkeypatch.setenv("ADALAYERS_CACHE", str(ro))
    with caplog.at_level("WARNING"):
        metrics = service.train(trained["cfg"](cache={"enabled": True}), tmp_path / "run")
    assert metrics["test"]["n"] == 40
    assert "cannot be created" in caplog.text and "running the base on the fly" in caplog.text


def test_a_nan_loss_in_the_first_epoch_claims_no_checkpoint(trained, tmp_path, monkeypatch):
    import math

    from adalayers.recipes import service
    from adalayers.model.sidetask import SideTask
    from adalayers.recipes.train import TrainingError

    real = SideTask.loss
    monkeypatch.setattr(SideTask, "loss", lambda self, logits, labels: real(self, logits, labels) * math.nan)
    with pytest.raises(TrainingError, match=r"at step 1 \(epoch 1\); stopped. No checkpoint was written") as e:
        service.train(trained["cfg"](), tmp_path / "run")
    assert "stays in" not in str(e.value) and not (tmp_path / "run" / runlib.HEAD).exists()
