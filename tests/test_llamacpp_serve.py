"""adalayers serve --runtime llama.cpp over real HTTP: the same JSON as the default runtime on the same GGUF base.

Two servers (uvicorn subprocesses on 127.0.0.1) serve one tiny F32 GGUF written by the test, with the same two
heads (a sequence and a token head): one on the default runtime (transformers, after the one conversion), one
on llama.cpp. /predict, /generate and /generate/stream must agree (labels, tags, generated text, and values
to the precision of llama.cpp's f16 KV cache).
"""
from __future__ import annotations

import json

import httpx
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'adalayers[llamacpp]')")

from adalayers.model.backbone import Backbone  # noqa: E402
from runs_util import NER, assert_json_close, make_run  # noqa: E402
from test_serve_hardening import Server  # noqa: E402
from tinygguf import write_tiny_llama  # noqa: E402

PROMPTS = ["the cat sat on the", "a man in the other room"]


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    root = tmp_path_factory.mktemp("llamacpp_serve")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ADALAYERS_CACHE", str(root / "cache"))
        gguf = write_tiny_llama(root / "tiny-llama.gguf")
        base = Backbone.load(str(gguf), "decoder")
        runs = {"root": root, "base": gguf,
                "acc": make_run(root / "acc", base, "sequence", ["bad", "good"], seed=3, max_length=64),
                "ner": make_run(root / "ner", base, "token", NER, seed=4, max_length=64)}
        started = [Server(runs), Server(runs, "--runtime", "llama.cpp")]
        try:
            yield [s.wait_started() for s in started]
        finally:
            for s in started:
                s.stop()


def _post(server, path, body):
    r = httpx.post(server.url + path, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _close(a, b, where=""):
    """Equal JSON, floats within 2e-3 (llama.cpp keeps its KV cache in f16)."""
    assert_json_close(a, b, 2e-3, where)


def test_predict_answers_the_same(servers):
    torch_, llama = servers
    body = {"texts": PROMPTS + ["there"]}
    _close(_post(torch_, "/predict", body), _post(llama, "/predict", body))


def test_generate_answers_the_same(servers):
    torch_, llama = servers
    body = {"prompts": PROMPTS, "max_new_tokens": 6, "steps": True, "answer_only": ["acc"]}
    a, b = _post(torch_, "/generate", body), _post(llama, "/generate", body)
    _close(a, b)
    assert all(r["tokens"] >= 1 for r in b["results"])


def test_generate_stream_gives_the_same_events(servers):
    torch_, llama = servers
    body = {"prompts": PROMPTS[:1], "max_new_tokens": 5, "steps": True}

    def events(server):
        out = []
        with httpx.stream("POST", server.url + "/generate/stream", json=body, timeout=120) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data:"):
                    out.append(json.loads(line[5:]))
        return out

    a, b = events(torch_), events(llama)
    assert len(b) >= 3 and b[-1]["results"][0]["steps"]["acc"]  # prompt, steps, done
    assert [sorted(e) for e in a] == [sorted(e) for e in b]
    _close(a, b)
