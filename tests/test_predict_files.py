"""predict-files: output equal to SideTasks.predict, bad rows, resume after a real kill, Ray Data row for row."""
from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from adalayers.bulk import local
from adalayers.bulk.local import MANIFEST, Job
from adalayers.bulk.predictor import BatchPredictor
from adalayers.cli import main
from adalayers.errors import DataError
from adalayers.serve.api import SideTasks

from bulk_util import saved_base_and_heads, sentences

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return saved_base_and_heads(tmp_path_factory.mktemp("bulk"))


@pytest.fixture(scope="module")
def predictor(model):
    return BatchPredictor(*model, num_threads=1)


def write_csv(path: Path, rows, header=("id", "text")) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow(header)
        w.writerows(rows)
    return path


def read_output(folder: Path) -> pa.Table:
    return pq.read_table(folder)  # _manifest.json is skipped ("_" prefix)


def test_every_format_matches_side_tasks(model, predictor, tmp_path):
    texts = sentences(75, seed=1)
    folder = tmp_path / "in"
    folder.mkdir()
    write_csv(folder / "a.csv", [(f"c{i}", t) for i, t in enumerate(texts[:25])])
    (folder / "b.jsonl").write_text("".join(json.dumps({"id": 100 + i, "text": t, "x": 1}) + "\n"
                                            for i, t in enumerate(texts[25:50])), encoding="utf-8")
    pq.write_table(pa.table({"text": texts[50:], "id": [f"p{i}" for i in range(25)]}), folder / "c.parquet")
    (folder / "notes.txt").write_text("not an input", encoding="utf-8")
    job = Job(base=model[0], heads=model[1], input=str(folder), part_rows=30)
    manifest = local.run(job, tmp_path / "out", batch_size=8, predictor=predictor)
    assert manifest["complete"] and manifest["rows"] == 75 and len(manifest["parts"]) == 3
    assert manifest["parts"][1]["first"] == f"{folder / 'b.jsonl'}:6"
    out = read_output(tmp_path / "out")
    assert out.column_names == ["id", "acc_label", "acc_score", "ner_words", "ner_tags"]
    ids = [f"c{i}" for i in range(25)] + [str(100 + i) for i in range(25)] + [f"p{i}" for i in range(25)]
    assert out.column("id").to_pylist() == ids
    side = SideTasks.load(model[0], model[1], primary=False)
    for row, ref in zip(out.to_pylist(), side.predict(texts)):
        acc = ref["tasks"]["acc"]
        assert row["acc_label"] == acc["label"]
        assert row["acc_score"] == pytest.approx(acc["probabilities"][acc["label"]], abs=1e-5)
        assert (row["ner_words"], row["ner_tags"]) == (ref["tasks"]["ner"]["words"], ref["tasks"]["ner"]["tags"])
    assert len(set(out.column("acc_label").to_pylist())) == 2  # the random head is not constant


def test_bad_rows_name_file_and_line_or_are_skipped(model, predictor, tmp_path):
    good = sentences(6, seed=2)
    path = write_csv(tmp_path / "in.csv", [(i, t) for i, t in enumerate(good[:3])] + [(3, ""), (4, "a", "b")]
                     + [(i + 5, t) for i, t in enumerate(good[3:])])
    job = Job(base=model[0], heads=model[1], input=str(path))
    with pytest.raises(DataError, match=rf"{path}:5: the text column 'text' is empty"):
        local.run(job, tmp_path / "out", predictor=predictor)
    job.skip_bad_rows = True
    manifest = local.run(job, tmp_path / "out2", predictor=predictor)
    assert manifest["rows"] == 6 and manifest["bad_rows"] == 2
    assert manifest["first_bad_rows"][1].startswith(f"{path}:6: expected 2 columns")
    assert read_output(tmp_path / "out2").column("id").to_pylist() == ["0", "1", "2", "5", "6", "7"]


def test_one_line_errors_from_the_cli(model, tmp_path, capsys):
    path = write_csv(tmp_path / "in.csv", [("1", "a good movie")], header=("key", "review"))
    args = ["predict-files", "--base", model[0], "--heads", *model[1], "--output", str(tmp_path / "out")]
    assert main(args + ["--input", str(path)]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (f"error: {path}: no column 'id' (columns: key, review); "
                                               "name the columns with --id-column / --text-column")
    assert main(args + ["--input", str(tmp_path / "*.tsv")]) == 2
    assert "the pattern matches no files" in capsys.readouterr().err
    assert main(args + ["--input", str(path), "--id-column", "key", "--text-column", "review"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"] == 1
    assert main(args + ["--input", str(path), "--id-column", "key", "--text-column", "review",
                        "--part-rows", "5"]) == 2
    assert "other settings (part_rows differ)" in capsys.readouterr().err


def test_resume_after_a_kill(model, predictor, tmp_path):
    """A real SIGKILL mid-job; the rerun keeps the finished parts and its output equals an uninterrupted run."""
    path = write_csv(tmp_path / "in.csv", [(f"r{i}", t) for i, t in enumerate(sentences(3000, seed=3))])
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "adalayers.cli", "predict-files", "--base", model[0], "--heads", *model[1],
           "--input", str(path), "--output", str(out), "--part-rows", "100", "--batch-size", "25", "--threads", "1"]
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    parts, deadline = [], time.time() + 240
    try:
        while time.time() < deadline and proc.poll() is None:
            if (out / MANIFEST).is_file():
                parts = json.loads((out / MANIFEST).read_text())["parts"]
                if len(parts) >= 2:
                    break
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    manifest = json.loads((out / MANIFEST).read_text())
    assert 2 <= len(manifest["parts"]) < 30 and not manifest["complete"], "the kill came too late to test resuming"
    kept = {p["name"]: (out / p["name"]).stat().st_ino for p in manifest["parts"]}
    job = Job(base=model[0], heads=model[1], input=str(path), part_rows=100)
    resumed = local.run(job, out, batch_size=25, predictor=predictor)
    assert resumed["complete"] and resumed["rows"] == 3000 and len(resumed["parts"]) == 30
    assert all((out / name).stat().st_ino == ino for name, ino in kept.items())  # finished parts not redone
    assert not list(out.glob(".*.tmp"))
    whole = local.run(job, tmp_path / "whole", batch_size=25, predictor=predictor)
    assert whole["rows"] == 3000
    assert read_output(out).equals(read_output(tmp_path / "whole"))


# --- the Ray Data engine --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def local_ray():
    """One local Ray for this module's Ray tests: loopback only, no dashboard, no usage stats."""
    ray = pytest.importorskip("ray")
    from adalayers.bulk.ray_engine import init_ray

    started = init_ray(num_cpus=2)
    assert ray.util.get_node_ip_address() == "127.0.0.1"  # loopback, though this module imported Ray first
    yield ray
    if started:
        ray.shutdown()


def test_ray_data_equals_the_local_engine_row_for_row(model, predictor, local_ray, tmp_path):
    """One format: the same rows in the same order. Mixed formats (a union in Ray): the same rows by id."""
    texts = sentences(2000, seed=4)
    folder = tmp_path / "in"
    folder.mkdir()
    write_csv(folder / "a.csv", [(f"{i:05d}", t) for i, t in enumerate(texts[:800])])
    write_csv(folder / "b.csv", [(f"{i:05d}", t) for i, t in enumerate(texts[800:1400], start=800)])
    pq.write_table(pa.table({"id": [f"p{i}" for i in range(600)], "text": texts[1400:]}), tmp_path / "c.parquet")
    job = Job(base=model[0], heads=model[1], input=str(folder), part_rows=500)
    mine = local.run(job, tmp_path / "local", batch_size=64, predictor=predictor)
    from adalayers.bulk import ray_engine

    theirs = ray_engine.run(job, tmp_path / "ray", batch_size=64, concurrency=2, cpus_per_actor=0.5, device="cpu")
    assert mine["rows"] == theirs["rows"] == 1400
    a, b = read_output(tmp_path / "local"), read_output(tmp_path / "ray")
    assert a.column("id").to_pylist() == [f"{i:05d}" for i in range(1400)]  # ids stay text, in input order
    assert_same_rows(a, b)
    (folder / "c.parquet").write_bytes((tmp_path / "c.parquet").read_bytes())  # now csv + parquet
    job = Job(base=model[0], heads=model[1], input=str(folder), part_rows=500)
    local.run(job, tmp_path / "local2", batch_size=64, predictor=predictor)
    assert ray_engine.run(job, tmp_path / "ray2", batch_size=64, concurrency=2, device="cpu")["rows"] == 2000
    assert_same_rows(read_output(tmp_path / "local2").sort_by("id"), read_output(tmp_path / "ray2").sort_by("id"))


def assert_same_rows(a: pa.Table, b: pa.Table) -> None:
    assert a.schema.equals(b.schema) and a.num_rows == b.num_rows
    for name in a.column_names:
        if name.endswith("_score"):
            assert a.column(name).to_pylist() == pytest.approx(b.column(name).to_pylist(), abs=1e-5)
        else:
            assert a.column(name).to_pylist() == b.column(name).to_pylist(), name


def test_without_ray_the_engine_says_how_to_install_it(model, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets where Ray is not installed
    path = write_csv(tmp_path / "in.csv", [("1", "a good movie")])
    assert main(["predict-files", "--base", model[0], "--heads", *model[1], "--input", str(path),
                 "--output", str(tmp_path / "out"), "--engine", "ray"]) == 2
    assert capsys.readouterr().err.strip() == "error: --engine ray needs Ray: pip install 'adalayers[ray]'"
