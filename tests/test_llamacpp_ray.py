"""The llama.cpp runtime on Ray: `serve --engine ray` and `predict-files --engine ray`, each replica and actor loading
its own llama.cpp engine (one thread), on the tiny F32 GGUF base and heads of runs_util.tiny_gguf_runs.

The session's local Ray (conftest.local_ray: node address 127.0.0.1, no dashboard, no usage stats; each test
asks for `runs` before it, so a Ray this module starts is started inside tiny_gguf_runs and its workers inherit
that ADALAYERS_CACHE), one replica, one actor:
- Ray Serve with `--runtime llama.cpp`: /predict answers what the default runtime's app answers on the same texts
  (labels and tags equal, values within 2e-3: llama.cpp keeps its KV cache in f16); /generate's greedy JSON,
  token ids included, is the llama.cpp runtime's own in this process (SideTasks.generate).
- predict-files --engine ray --runtime llama.cpp (Ray Data) writes the rows of --engine local --runtime llama.cpp,
  row for row in the input's order.
"""
from __future__ import annotations

import json

import httpx
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'adalayers[llamacpp]')")
pytest.importorskip("ray", reason="Ray is not installed (pip install 'adalayers[ray]')")

from fastapi.testclient import TestClient  # noqa: E402

from adalayers.cli import main  # noqa: E402
from adalayers.infer.sidetasks import SideTasks  # noqa: E402
from adalayers.serve.app import create_app  # noqa: E402
from adalayers.serve.config import ServeConfig  # noqa: E402
from bulk_util import sentences  # noqa: E402
from runs_util import assert_json_close, free_port, tiny_gguf_runs  # noqa: E402
from test_predict_files import assert_same_rows, read_output, write_csv  # noqa: E402

PROMPTS = ["the cat sat on the", "a man in the other room"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    with tiny_gguf_runs(tmp_path_factory.mktemp("llamacpp_ray")) as runs:
        runs["heads"] = [str(runs["acc"]), str(runs["ner"])]
        yield runs


@pytest.fixture(scope="module")
def ray_llama(runs, local_ray):
    """`serve --engine ray --runtime llama.cpp --replicas 1 --threads 1` (serve/ray_serve.start, as the CLI calls it)."""
    from ray import serve

    from adalayers.serve import ray_serve

    cfg = ServeConfig(port=free_port(), device="cpu", num_threads=1, request_timeout_s=300.0)
    url = ray_serve.start(str(runs["base"]), runs["heads"], cfg, replicas=1, runtime="llama.cpp")
    try:
        with httpx.Client(base_url=url, timeout=330) as client:
            yield client, cfg
    finally:
        serve.shutdown()


def _ok(r: httpx.Response) -> dict:
    assert r.status_code == 200, r.text
    return r.json()


def test_ray_serve_on_llama_cpp_answers_as_the_default_runtime_and_generates_its_own_ids(runs, ray_llama):
    client, cfg = ray_llama
    body = {"texts": PROMPTS + ["there"]}
    with TestClient(create_app(SideTasks.load(str(runs["base"]), runs["heads"]), cfg)) as default:
        want = _ok(default.post("/predict", json=body))
    got = _ok(client.post("/predict", json=body))
    assert [r["tasks"]["ner"]["tags"] for r in got["results"]] == [r["tasks"]["ner"]["tags"] for r in want["results"]]
    assert_json_close(got, want, 2e-3)

    gen = {"prompts": PROMPTS, "max_new_tokens": 6, "steps": True}
    got = _ok(client.post("/generate", json=gen))["results"]
    side = SideTasks.load(str(runs["base"]), runs["heads"], runtime="llama.cpp", threads=1)
    alone = side.generate(PROMPTS, max_new_tokens=6, steps=True)
    assert [r["token_ids"] for r in got] == [r["token_ids"] for r in alone]
    assert all(r["token_ids"] for r in got)
    assert_json_close(got, json.loads(json.dumps(alone)), 2e-3)


def test_predict_files_on_ray_data_with_llama_cpp_equals_the_local_engine_row_for_row(runs, local_ray, tmp_path,
                                                                                        capsys):
    src = write_csv(tmp_path / "in.csv", [(f"{i:03d}", t) for i, t in enumerate(sentences(40, seed=7))])
    args = ["predict-files", "--heads", *runs["heads"], "--input", str(src), "--runtime", "llama.cpp",
            "--threads", "1", "--batch-size", "16"]
    assert main(args + ["--output", str(tmp_path / "local")]) == 0
    assert main(args + ["--output", str(tmp_path / "ray"), "--engine", "ray", "--concurrency", "1"]) == 0
    assert [json.loads(line)["rows"] for line in capsys.readouterr().out.splitlines()] == [40, 40]
    manifest = json.loads((tmp_path / "ray" / "_manifest.json").read_text())
    assert (manifest["engine"], manifest["job"]["runtime"]) == ("ray", "llama.cpp")
    local, ray = read_output(tmp_path / "local"), read_output(tmp_path / "ray")
    assert local.column("id").to_pylist() == [f"{i:03d}" for i in range(40)]
    assert_same_rows(local, ray)
