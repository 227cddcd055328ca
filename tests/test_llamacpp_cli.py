"""`predict --runtime llama.cpp` and `predict-files --runtime llama.cpp`: the same answers as the default runtime on
one tiny F32 GGUF base written by the test (labels and tags equal, values within llama.cpp's precision)."""
from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'adalayers[llamacpp]')")

from adalayers.cli import main  # noqa: E402

from adalayers.recipes import service  # noqa: E402
from runs_util import assert_json_close, tiny_gguf_runs  # noqa: E402

TEXTS = ["the cat sat on the mat", "a man in the other room", "there"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    with tiny_gguf_runs(tmp_path_factory.mktemp("llamacpp_cli")) as runs:
        yield runs


@pytest.mark.parametrize("head", ["acc", "ner"])
def test_predict_on_llama_cpp_answers_as_the_default_runtime(runs, head, capsys):
    want = service.predict(runs[head], TEXTS)
    got = service.predict(runs[head], TEXTS, runtime="llama.cpp")
    assert_json_close(got, want, 2e-3)
    assert main(["predict", str(runs[head]), *TEXTS, "--json", "--runtime", "llama.cpp"]) == 0
    assert_json_close([json.loads(x) for x in capsys.readouterr().out.splitlines()], want, 2e-3)


def test_predict_files_on_llama_cpp_writes_what_the_default_runtime_writes(runs, tmp_path, capsys):
    src = tmp_path / "in.csv"
    src.write_text("id,text\n" + "".join(f"{i},{t}\n" for i, t in enumerate(TEXTS)), encoding="utf-8")
    tables = {}
    for runtime in ("torch", "llama.cpp"):
        out = tmp_path / runtime
        assert main(["predict-files", "--heads", str(runs["acc"]), str(runs["ner"]), "--input", str(src),
                     "--output", str(out), "--runtime", runtime]) == 0
        assert json.loads(capsys.readouterr().out)["rows"] == len(TEXTS)
        tables[runtime] = pq.read_table(sorted(out.glob("part-*.parquet"))).to_pylist()
        assert json.loads((out / "_manifest.json").read_text())["job"]["runtime"] == runtime
    assert_json_close(tables["llama.cpp"], tables["torch"], 2e-3)
    # a job is resumed only on the runtime it started with
    assert main(["predict-files", "--heads", str(runs["acc"]), str(runs["ner"]), "--input", str(src),
                 "--output", str(tmp_path / "torch"), "--runtime", "llama.cpp"]) == 2
    assert "other settings (runtime differ)" in capsys.readouterr().err
    # a manifest written before the runtime was recorded is the default runtime's
    path = tmp_path / "torch" / "_manifest.json"
    manifest = json.loads(path.read_text())
    del manifest["job"]["runtime"]
    path.write_text(json.dumps(manifest))
    assert main(["predict-files", "--heads", str(runs["acc"]), str(runs["ner"]), "--input", str(src),
                 "--output", str(tmp_path / "torch")]) == 0
