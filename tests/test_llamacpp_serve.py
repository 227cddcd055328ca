"""adalayers serve --runtime llama.cpp over real HTTP: the same JSON as the default runtime on the same GGUF base.

Two servers (uvicorn subprocesses on 127.0.0.1) serve one tiny F32 GGUF written by the test, with the same two
heads (a sequence and a token head): one on the default runtime (transformers, after the one conversion), one
on llama.cpp, its process unable to import torch, transformers, scikit-learn, SciPy or seqeval (the torch-free
path: infer/gguf_serving.py).
/predict, /generate, /generate/stream and /v1/chat/completions must agree (labels, tags, generated text, and
values to the precision of llama.cpp's f16 KV cache). Concurrent generations on llama.cpp share decode steps within
the generations' share of its context and answer as each alone.
"""
from __future__ import annotations

import json

import httpx
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'adalayers[llamacpp]')")

from runs_util import assert_json_close, tiny_gguf_runs  # noqa: E402
from test_serve_hardening import Server  # noqa: E402

PROMPTS = ["the cat sat on the", "a man in the other room"]
# what the torch-free server's process cannot import: the training stack (scikit-learn and SciPy: over 100 MB
# that seqeval's get_entities imported for the token head's entities; adalayers.entities serves them)
NOT_SERVING = ("torch", "transformers", "sklearn", "scipy", "seqeval")


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    with tiny_gguf_runs(tmp_path_factory.mktemp("llamacpp_serve")) as runs:
        template = runs["root"] / "chat.jinja"  # the tiny GGUF has no chat template of its own
        template.write_text("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
                            "{% if add_generation_prompt %}assistant:{% endif %}")
        chat = ("--chat-template", str(template))
        started = [Server(runs, *chat), Server(runs, "--runtime", "llama.cpp", *chat, without=NOT_SERVING)]
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


def test_chat_completions_answer_the_same_without_torch(servers):
    """/v1/chat/completions through the openai client: the same answer, side tasks and usage on both servers."""
    import openai

    answers = []
    for server in servers:
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0)
        model = client.models.list().data[0].id
        r = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "the cat sat"}],
                                           max_tokens=6, temperature=0, extra_body={"adalayers": {"steps": True}})
        answers.append((r.choices[0].message.content, r.choices[0].finish_reason, r.usage.completion_tokens,
                        r.model_extra["adalayers"]["choices"][0]))
    (text_a, finish_a, n_a, side_a), (text_b, finish_b, n_b, side_b) = answers
    assert (text_a, finish_a, n_a) == (text_b, finish_b, n_b) and n_b >= 1
    _close(side_a, side_b)
    assert side_b["prompt_tasks"]["acc"]["label"] in ("bad", "good")


COMPLETIONS = ["the cat sat on the", "a man in the other room", "there", "the other cat sat in a room"]


def _health_until(server, ok, seconds=30):
    """/health once `ok(health)` holds (a row's sequence is given back when its step ends), or the last one."""
    import time

    deadline = time.time() + seconds
    while True:
        h = server.health()
        if ok(h) or time.time() > deadline:
            return h
        time.sleep(0.05)


def test_concurrent_completions_share_decode_steps_on_llama_cpp(servers):
    """Continuous batching on llama.cpp (serve/scheduler.py within LlamaCppBackbone.generation_room): four
    concurrent greedy /v1/completions answer as each alone, while sharing decode steps; a /predict sent
    meanwhile is answered as alone; every llama.cpp sequence is given back afterwards.

    A long streamed completion is decoding when the four are sent, and its client leaves once they are answered:
    their steps are shared with its row whatever the machine's speed (four 40-token answers of the tiny model
    could each end before the next request arrived, and then no step was shared)."""
    import threading

    llama = servers[1]
    model = httpx.get(llama.url + "/v1/models", timeout=30).json()["data"][0]["id"]

    def complete(prompt):
        return _post(llama, "/v1/completions", {"model": model, "prompt": prompt, "max_tokens": 40,
                                                "temperature": 0})["choices"][0]["text"]

    predict = {"texts": PROMPTS * 10}
    alone = [complete(p) for p in COMPLETIONS]
    predicted = _post(llama, "/predict", predict)
    before = llama.health()
    got, answered = [None] * len(COMPLETIONS), []

    def client(i):
        got[i] = complete(COMPLETIONS[i])

    def predictor():
        answered.append(_post(llama, "/predict", predict))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(len(COMPLETIONS))]
    threads.append(threading.Thread(target=predictor))
    long = {"model": model, "prompt": "the cat", "max_tokens": 1500, "ignore_eos": True, "temperature": 0,
            "stream": True}
    with httpx.stream("POST", llama.url + "/v1/completions", json=long, timeout=120) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        while not next(lines).startswith("data:"):  # it decodes
            pass
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        during = llama.health()
    after = _health_until(llama, lambda h: h["llamacpp_sequences_free"] == h["llamacpp_sequences"])
    assert got == alone
    assert len(answered) == 1
    _close(answered[0], predicted)
    assert during["decode_steps"] - before["decode_steps"] < 1500  # the long one was still decoding
    steps, rows = after["decode_steps"] - before["decode_steps"], after["rows_decoded"] - before["rows_decoded"]
    assert rows > steps > 0  # some steps decoded rows of several requests together
    assert after["largest_step_rows"] >= 2
    assert after["llamacpp_sequences_free"] == after["llamacpp_sequences"]  # every sequence given back
    assert after["generations_waiting"] == 0


def test_a_generation_that_can_never_fit_the_context_is_refused(servers):
    """More prompts than the sequences generations may hold on llama.cpp: one 400 line naming the limit."""
    llama = servers[1]
    room = llama.health()["llamacpp_generation_sequences"]  # the passes keep the rest (generation_room)
    r = httpx.post(llama.url + "/generate", json={"prompts": ["the cat"] * (room + 1), "max_new_tokens": 2},
                   timeout=60)
    assert r.status_code == 400, r.text
    assert f"at most {room} sequences" in r.json()["detail"]


def test_the_torch_free_server_never_tried_to_import_the_training_stack(servers):
    """After every request above, the llama.cpp server's process has not even tried to import torch,
    transformers, scikit-learn, SciPy or seqeval: an attempt caught by an `except ImportError` (as the progress
    bars' set-up once did for transformers) passes the tests where they are blocked, yet imports them wherever
    they are installed (transformers alone: 1.2 s and 34 MB in every serving process). The one exception is
    numba's own check of SciPy's version at its import (numba/__init__.py: top-level `scipy` only, 1 MB)."""
    assert [name for name in servers[1].blocked_imports() if name != "scipy"] == []
