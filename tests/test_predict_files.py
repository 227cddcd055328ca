"""predict-files: output equal to SideTasks.predict, bad rows, resume after a real kill, Ray Data row for row."""
from __future__ import annotations

import dataclasses
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
from adalayers.infer.sidetasks import SideTasks

from bulk_util import pair_heads, saved_base_and_heads, sentences

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return saved_base_and_heads(tmp_path_factory.mktemp("bulk"))


@pytest.fixture(scope="module")
def predictor(model):
    return BatchPredictor(*model, num_threads=1)


@pytest.fixture(scope="module")
def pairs_model(model, tmp_path_factory):
    """(base folder, [pair classification head, pair regression head]) on the same saved base."""
    return model[0], pair_heads(tmp_path_factory.mktemp("bulk_pairs"), model[0])


@pytest.fixture(scope="module")
def pair_predictor(pairs_model):
    return BatchPredictor(*pairs_model, num_threads=1, text_pair_column="b")


def pair_files(folder: Path, n: int, seed: int) -> tuple[list[str], list[str], list[str]]:
    """n sentence pairs (columns id, a, b) spread over one CSV, TSV, JSON Lines and Parquet file in folder."""
    folder.mkdir()
    a, b = sentences(n, seed=seed), sentences(n, seed=seed + 100)
    ids = [f"{i:05d}" for i in range(n)]
    q = n // 4
    write_csv(folder / "1.csv", zip(ids[:q], a[:q], b[:q]), header=("id", "a", "b"))
    (folder / "2.tsv").write_text("id\ta\tb\n" + "".join(f"{i}\t{x}\t{y}\n" for i, x, y in
                                                           zip(ids[q:2 * q], a[q:2 * q], b[q:2 * q])), encoding="utf-8")
    (folder / "3.jsonl").write_text("".join(json.dumps({"b": y, "id": i, "a": x}) + "\n"
                                            for i, x, y in zip(ids[2 * q:3 * q], a[2 * q:3 * q], b[2 * q:3 * q])),
                                    encoding="utf-8")
    pq.write_table(pa.table({"a": a[3 * q:], "b": b[3 * q:], "id": ids[3 * q:]}), folder / "4.parquet")
    return ids, a, b


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


# --- sentence pairs ---------------------------------------------------------------------------------

def test_pairs_in_every_format_match_side_tasks(pairs_model, pair_predictor, tmp_path):
    ids, a, b = pair_files(tmp_path / "in", 40, seed=7)
    job = Job(base=pairs_model[0], heads=pairs_model[1], input=str(tmp_path / "in"), text_column="a",
              text_pair_column="b", part_rows=15)
    manifest = local.run(job, tmp_path / "out", batch_size=8, predictor=pair_predictor)
    assert manifest["complete"] and manifest["rows"] == 40 and len(manifest["parts"]) == 3
    out = read_output(tmp_path / "out")
    assert out.column_names == ["id", "para_label", "para_score", "sim_value"]
    assert out.column("id").to_pylist() == ids
    side = SideTasks.load(*pairs_model, primary=False)
    ref = side.predict(a, text_pairs=b)
    for row, r in zip(out.to_pylist(), ref):
        para = r["tasks"]["para"]
        assert row["para_label"] == para["label"]
        assert row["para_score"] == pytest.approx(para["probabilities"][para["label"]], abs=1e-5)
        assert row["sim_value"] == pytest.approx(r["tasks"]["sim"]["value"], abs=1e-5)
    swapped = side.predict(b, text_pairs=a)  # the second text is read, in its place
    assert [r["tasks"]["sim"]["value"] for r in swapped] != pytest.approx(out.column("sim_value").to_pylist(), abs=1e-5)
    assert len(set(out.column("para_label").to_pylist())) == 2


def test_pair_heads_and_single_heads_are_refused_in_one_line(model, pairs_model, tmp_path, capsys):
    path = write_csv(tmp_path / "in.csv", [("1", "a good movie", "a bad film")], header=("id", "a", "b"))
    out = tmp_path / "out"
    args = ["predict-files", "--base", model[0], "--input", str(path), "--output", str(out), "--text-column", "a"]
    cases = [(pairs_model[1], [], "error: head 'para' was trained on sentence pairs: give each text its second text "
                                  "(predict --pair A B, predict-files --text-pair-column, text_pairs=[...], "
                                  "or [a, b] in the service's texts)"),
             (model[1], ["--pair-column", "b"], "error: head 'acc' was trained on single texts, not sentence pairs: "
                                                "give texts without a second text"),
             ([model[1][0], pairs_model[1][0]], ["--text-pair-column", "b"],
              "error: predict-files runs heads of one input kind per job, got sentence-pair heads (para) and "
              "single-text heads (acc): run the pair heads with --text-pair-column and the others without it, "
              "into two --output folders")]
    for heads, extra, says in cases:
        for engine in ("local", "ray"):
            assert main(args + ["--heads", *heads, "--engine", engine] + extra) == 2
            assert capsys.readouterr().err.strip().splitlines() == [says]
            assert not out.exists()  # refused before any model or Ray started
    assert main(args + ["--heads", *pairs_model[1], "--text-pair-column", "c", "--engine", "ray"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: {path}: no column 'c' (columns: id, a, b); name the columns with --id-column / --text-column / "
        f"--text-pair-column"]


def test_pair_bad_rows_and_resume_after_an_interruption(pairs_model, pair_predictor, tmp_path):
    """An empty second text is a bad row (file and line, or skipped); a job stopped after its second part
    resumes with the finished parts kept, ending equal to an uninterrupted run."""
    a, b = sentences(120, seed=8), sentences(120, seed=9)
    b[30] = " "
    path = tmp_path / "in.tsv"
    path.write_text("id\ta\tb\n" + "".join(f"r{i}\t{x}\t{y}\n" for i, (x, y) in enumerate(zip(a, b))),
                    encoding="utf-8")
    job = Job(base=pairs_model[0], heads=pairs_model[1], input=str(path), text_column="a", text_pair_column="b",
              part_rows=25)
    with pytest.raises(DataError, match=rf"^{path}:32: the second-text column 'b' is empty$"):
        local.run(job, tmp_path / "strict", predictor=pair_predictor)
    job.skip_bad_rows = True

    class Stop(Exception):
        pass

    class StopsAfter:
        """The real predictor, interrupted when the third part's first batch is asked for."""
        def __init__(self, batches: int):
            self.left = batches

        def predict(self, *args):
            self.left -= 1
            if self.left < 0:
                raise Stop
            return pair_predictor.predict(*args)

    out = tmp_path / "out"
    with pytest.raises(Stop):
        local.run(job, out, batch_size=5, predictor=StopsAfter(10))
    manifest = json.loads((out / MANIFEST).read_text())
    assert [p["rows"] for p in manifest["parts"]] == [25, 25] and manifest["consumed"] == 51  # + the bad row
    kept = {p["name"]: (out / p["name"]).stat().st_ino for p in manifest["parts"]}
    resumed = local.run(job, out, batch_size=5, predictor=pair_predictor)
    assert resumed["complete"] and resumed["rows"] == 119 and resumed["bad_rows"] == 1  # met again, re-reading
    assert all((out / name).stat().st_ino == ino for name, ino in kept.items())
    whole = local.run(job, tmp_path / "whole", batch_size=5, predictor=pair_predictor)
    assert whole["rows"] == 119 and whole["bad_rows"] == 1
    assert read_output(out).equals(read_output(tmp_path / "whole"))
    assert "r30" not in read_output(out).column("id").to_pylist()
    other = dataclasses.replace(job, text_pair_column="a", files=[])  # its fields (the parsed heads are cached apart)
    with pytest.raises(DataError, match="other settings \\(text_pair_column differ\\)"):
        local.run(other, out, predictor=pair_predictor)


# --- the Ray Data engine (on the session's local Ray: conftest.local_ray) ---------------------------

def test_ray_data_equals_the_local_engine_row_for_row(model, predictor, local_ray, tmp_path):
    """One format: the same rows in the same order. Mixed formats (a union in Ray): the same rows by id."""
    texts = sentences(600, seed=4)  # several batches and output parts a file, spread over 2 actors
    folder = tmp_path / "in"
    folder.mkdir()
    write_csv(folder / "a.csv", [(f"{i:05d}", t) for i, t in enumerate(texts[:240])])
    write_csv(folder / "b.csv", [(f"{i:05d}", t) for i, t in enumerate(texts[240:420], start=240)])
    pq.write_table(pa.table({"id": [f"p{i}" for i in range(180)], "text": texts[420:]}), tmp_path / "c.parquet")
    job = Job(base=model[0], heads=model[1], input=str(folder), part_rows=150)
    mine = local.run(job, tmp_path / "local", batch_size=32, predictor=predictor)
    from adalayers.bulk import ray_engine

    theirs = ray_engine.run(job, tmp_path / "ray", batch_size=32, concurrency=2, cpus_per_actor=0.5, device="cpu")
    assert mine["rows"] == theirs["rows"] == 420
    a, b = read_output(tmp_path / "local"), read_output(tmp_path / "ray")
    assert a.column("id").to_pylist() == [f"{i:05d}" for i in range(420)]  # ids stay text, in input order
    assert_same_rows(a, b)
    (folder / "c.parquet").write_bytes((tmp_path / "c.parquet").read_bytes())  # now csv + parquet
    job = Job(base=model[0], heads=model[1], input=str(folder), part_rows=150)
    local.run(job, tmp_path / "local2", batch_size=32, predictor=predictor)
    assert ray_engine.run(job, tmp_path / "ray2", batch_size=32, concurrency=2, device="cpu")["rows"] == 600
    assert_same_rows(read_output(tmp_path / "local2").sort_by("id"), read_output(tmp_path / "ray2").sort_by("id"))


def assert_same_rows(a: pa.Table, b: pa.Table) -> None:
    assert a.schema.equals(b.schema) and a.num_rows == b.num_rows
    for name in a.column_names:
        if name.endswith(("_score", "_value")):
            assert a.column(name).to_pylist() == pytest.approx(b.column(name).to_pylist(), abs=1e-5)
        else:
            assert a.column(name).to_pylist() == b.column(name).to_pylist(), name


def test_without_ray_the_engine_says_how_to_install_it(model, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # what `import ray` meets where Ray is not installed
    path = write_csv(tmp_path / "in.csv", [("1", "a good movie")])
    assert main(["predict-files", "--base", model[0], "--heads", *model[1], "--input", str(path),
                 "--output", str(tmp_path / "out"), "--engine", "ray"]) == 2
    assert capsys.readouterr().err.strip() == "error: --engine ray needs Ray: pip install 'adalayers[ray]'"


def test_ray_data_pairs_equal_the_local_engine_row_for_row(pairs_model, pair_predictor, local_ray, tmp_path):
    """Sentence pairs in CSV, TSV, JSON Lines and Parquet: Ray Data with 2 actors gives the local rows."""
    ids, _, _ = pair_files(tmp_path / "in", 400, seed=10)
    job = Job(base=pairs_model[0], heads=pairs_model[1], input=str(tmp_path / "in"), text_column="a",
              text_pair_column="b", part_rows=100)
    mine = local.run(job, tmp_path / "local", batch_size=32, predictor=pair_predictor)
    from adalayers.bulk import ray_engine

    theirs = ray_engine.run(job, tmp_path / "ray", batch_size=32, concurrency=2, device="cpu")
    assert mine["rows"] == theirs["rows"] == 400
    a, b = read_output(tmp_path / "local"), read_output(tmp_path / "ray").sort_by("id")
    assert a.column("id").to_pylist() == ids
    assert_same_rows(a, b)


# --- no row lost: every row is in the output or in _bad_rows.txt ---------------------------------------

def test_an_unterminated_quote_costs_one_row_not_the_rest_of_the_file(model, predictor, tmp_path, capsys):
    texts = [t.replace(",", "and") for t in sentences(1002, seed=11)]  # no field needs quotes
    path = write_csv(tmp_path / "in.csv", [(f"r{i}", t) for i, t in enumerate(texts)])
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    lines[3] = 'r2,"' + texts[2] + "\n"  # the quote is never closed: the rest of the file would be one field
    path.write_text("".join(lines), encoding="utf-8")
    args = ["predict-files", "--base", model[0], "--heads", *model[1], "--input", str(path), "--threads", "1"]
    assert main(args + ["--output", str(tmp_path / "strict")]) == 2
    assert (f"error: {path}:4: a quoted field opened here is never closed; lines 4-1003 would be one row\n"
            in capsys.readouterr().err)
    assert main(args + ["--output", str(tmp_path / "out"), "--skip-bad-rows"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert (printed["rows_read"], printed["rows"], printed["bad_rows"]) == (1002, 1001, 1)
    ids = read_output(tmp_path / "out").column("id").to_pylist()
    assert ids == [f"r{i}" for i in range(1002) if i != 2]
    report = (tmp_path / "out" / local.BAD_ROWS).read_text(encoding="utf-8").splitlines()
    assert report == [f"{path}:4: a quoted field opened here is never closed; lines 4-1003 would be one row"]


def test_bad_texts_deep_json_and_long_lines_are_bad_rows(model, predictor, tmp_path, monkeypatch):
    from adalayers.data.tasks import tables

    monkeypatch.setattr(tables, "MAX_LINE_BYTES", 4096)
    good = sentences(5, seed=12)
    bad = ["   ", "\u200b\u200b", "a \ud800 b", "\u0301\u0301", "\u2800 \u3164"]
    lines = [json.dumps({"id": f"g{i}", "text": t}) for i, t in enumerate(good)]
    lines[1:1] = [json.dumps({"id": f"b{i}", "text": t}) for i, t in enumerate(bad)]
    lines.insert(3, '{"id": "deep", "text": ' + "[" * 2000 + "]" * 2000 + "}")
    lines.insert(4, json.dumps({"id": "long", "text": "word " * 2000}))
    lines.insert(5, json.dumps({"id": "nested", "text": [[["x"]]]}))
    path = tmp_path / "in.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    job = Job(base=model[0], heads=model[1], input=str(path), part_rows=3, skip_bad_rows=True)
    manifest = local.run(job, tmp_path / "out", batch_size=2, predictor=predictor)
    assert (manifest["rows_read"], manifest["rows"], manifest["bad_rows"]) == (len(lines), 5, len(bad) + 3)
    assert read_output(tmp_path / "out").column("id").to_pylist() == [f"g{i}" for i in range(5)]
    report = (tmp_path / "out" / local.BAD_ROWS).read_text(encoding="utf-8").splitlines()
    assert len(report) == len(bad) + 3 and all(m.startswith(f"{path}:") for m in report)
    assert f"{path}:4: the JSON is nested too deeply to read" in report
    assert f"{path}:5: the line is longer than 4096 bytes" in report
    assert any(m.startswith(f"{path}:4") for m in report) and "text 1" not in "".join(report)
    assert sum("is empty" in m for m in report) == 4 and sum("lone surrogate" in m for m in report) == 1
    job.skip_bad_rows = False
    with pytest.raises(DataError, match=rf"^{path}:2: the text column 'text' is empty$"):
        local.run(job, tmp_path / "strict", predictor=predictor)


def test_a_long_line_is_read_in_bounded_memory(tmp_path, monkeypatch):
    import tracemalloc

    from adalayers.data.tasks import skipping_bad_rows, tables

    monkeypatch.setattr(tables, "MAX_LINE_BYTES", 1 << 20)
    path = tmp_path / "in.jsonl"
    with open(path, "w", encoding="utf-8") as f:
        f.write('{"id": 1, "text": "' + "x" * (24 << 20) + '"}\n{"id": 2, "text": "ok"}\n')
    tracemalloc.start()
    with skipping_bad_rows(True) as skipped:
        rows = list(tables.iter_jsonl(path))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert [r[1]["id"] for r in rows] == [2] and skipped == [f"{path}:1: the line is longer than {1 << 20} bytes"]
    assert peak < 4 * (1 << 20)  # a few times the limit, not the line's 24 MiB


def test_the_ray_batch_applies_the_same_text_rule(predictor):
    batch = {"id": ["a", "b", "c"], "text": ["a good movie", "\u200b\u200b", "x \ud800"]}
    with pytest.raises(DataError, match="the row with id 'b' has no text in column 'text'"):
        predictor(batch)
    predictor.skip_bad_rows = True
    try:
        assert predictor(batch).column("id").to_pylist() == ["a"]
    finally:
        predictor.skip_bad_rows = False


def test_each_log_line_is_printed_once(model, tmp_path):
    """Issue 56: `predict-files` printed every log line twice (its own basicConfig handler beside adalayers')."""
    path = write_csv(tmp_path / "in.csv", [(0, "a good movie"), (1, ""), (2, "a bad one")])
    cmd = [sys.executable, "-m", "adalayers.cli", "predict-files", "--base", model[0], "--heads", *model[1],
           "--input", str(path), "--output", str(tmp_path / "out"), "--skip-bad-rows", "--threads", "1"]
    proc = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(ROOT / "src")}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert any("in.csv:3" in line for line in lines), lines
    assert len(lines) == len(set(lines)), lines
