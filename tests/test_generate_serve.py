"""POST /generate and its server-sent-event stream, on a tiny random decoder LLM."""
from __future__ import annotations

import json
import time

import httpx
import pytest
from fastapi.testclient import TestClient

from adalayers.serve.config import ServeConfig
from adalayers.infer.sidetasks import SideTasks
from adalayers.serve.app import create_app
from runs_util import NER, make_run, serve_in_thread
from tinydecoders import decoder_backbone

PROMPTS = ["the dog runs quickly and", "a book"]


@pytest.fixture(scope="module")
def side(tmp_path_factory):
    base = decoder_backbone("llama")
    root = tmp_path_factory.mktemp("runs")
    return SideTasks.from_backbone(base, [make_run(root / "acc", base, "sequence", ["bad", "good"], seed=3),
                                          make_run(root / "ner", base, "token", NER, seed=4)])


@pytest.fixture(scope="module")
def client(side):
    with TestClient(create_app(side, ServeConfig(max_texts=3, max_chars=50, max_wait_ms=1))) as c:
        yield c


def test_generate_returns_text_and_side_outputs(client, side):
    r = client.post("/generate", json={"prompts": PROMPTS, "max_new_tokens": 4, "steps": True})
    assert r.status_code == 200, r.text
    got = r.json()["results"]
    direct = side.generate(PROMPTS, max_new_tokens=4, steps=True)
    for a, b in zip(got, direct):
        assert a["text"] == b["text"] and a["finish"] == b["finish"]
        assert a["tasks"]["acc"]["probabilities"]["good"] == pytest.approx(
            b["tasks"]["acc"]["probabilities"]["good"], abs=1e-6)
        assert a["tasks"]["ner"]["words"] == (a["prompt"] + a["text"]).split()
        assert len(a["steps"]["acc"]) == a["tokens"]
    # the prompt's side outputs are what /predict answers for the prompt
    pred = client.post("/predict", json={"texts": PROMPTS}).json()["results"]
    for a, p in zip(got, pred):
        assert a["prompt_tasks"]["acc"]["probabilities"]["good"] == pytest.approx(
            p["tasks"]["acc"]["probabilities"]["good"], abs=1e-5)
        assert a["prompt_tasks"]["ner"]["tags"] == p["tasks"]["ner"]["tags"]
        assert "next_token" in p["base"]


@pytest.mark.parametrize("body,status,says", [
    ({"prompts": []}, 422, "prompts is empty"),
    ({"prompts": ["a"] * 4}, 413, "limit is 3"),
    ({"prompts": ["a" * 51]}, 413, "prompt 1 has 51 characters"),
    ({"prompts": [" "]}, 422, "prompt 1 is empty"),
    ({"prompts": ["a", "\u200b\x00"]}, 422, "prompt 2 is empty"),  # zero-width + NUL: the /predict rule
    ({"prompts": ["a"], "tasks": ["nope"]}, 400, "unknown task(s): nope"),
    ({"prompts": ["a"], "guard": {"acc": {"label": "meh", "threshold": 0.5}}}, 400, "one of its labels"),
    ({"prompts": ["a"], "max_new_tokens": 100000}, 422, "max_new_tokens"),
    ({"prompts": ["a"], "temperature": 0}, 422, "temperature"),
])
def test_bad_generate_requests_say_what_is_wrong(client, body, status, says):
    for path in ("/generate", "/generate/stream"):
        r = client.post(path, json=body)
        assert r.status_code == status, (path, r.text)
        assert says in r.text


@pytest.mark.parametrize("raw,says", [
    (b'{"prompts": ["\\ud800 a"]}', "prompt 1 is not valid Unicode"),
    (b'{"prompts": ["a"], "temperature": NaN}', "non-finite number"),
])
def test_generate_refuses_what_predict_refuses(client, raw, says):
    for path in ("/generate", "/generate/stream"):
        r = client.post(path, content=raw, headers={"content-type": "application/json"})
        assert r.status_code == 422, (path, r.text)
        assert says in r.text


def _events(text: str) -> list[tuple[str, dict]]:
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.split("\n"))
        out.append((lines["event"], json.loads(lines["data"])))
    return out


def test_stream_over_real_http_and_a_client_that_leaves(side):
    with serve_in_thread(create_app(side, ServeConfig()), log_level="warning") as url:
        body = {"prompts": PROMPTS, "max_new_tokens": 5, "tasks": ["acc"]}
        with httpx.Client(base_url=url, timeout=30) as c:
            r = c.post("/generate/stream", json=body)
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            events = _events(r.text)
            kinds = [k for k, _ in events]
            assert kinds[0] == "prompt" and kinds[-1] == "done" and 1 <= kinds.count("step") <= 5
            done = events[-1][1]["results"]
            assert done == c.post("/generate", json=body).json()["results"]
            steps = [e for k, e in events if k == "step"]
            pieces = ["".join(p or "" for p in col) for col in zip(*[s["tokens"] for s in steps])]
            assert [len(p) > 0 for p in pieces] == [d["tokens"] > 0 for d in done]
            # a client that leaves after the first event: the generation stops and frees the base
            with c.stream("POST", "/generate/stream", json={**body, "max_new_tokens": 200}) as s:
                next(s.iter_lines())
            t0 = time.time()
            again = c.post("/generate", json={"prompts": ["a book"], "max_new_tokens": 2})
            assert again.status_code == 200 and time.time() - t0 < 25


def test_streams_count_against_the_queue_of_predictions_while_they_stream(tmp_path, monkeypatch):
    """/generate/stream and /v1 generations count under --max-queue (2 here) with /predict's requests, as
    /generate does: two open streams fill the queue (a /predict, a third stream and a /v1 completion are 503
    with Retry-After); once their clients leave, the slots come back. Over real HTTP (uvicorn); each decode step
    is slowed to 50 ms and the text runs to max_new_tokens, so the streams last seconds while the refusals take
    milliseconds, whatever the machine's load."""
    base = decoder_backbone("llama")
    side = SideTasks.from_backbone(base, [make_run(tmp_path / "acc", base, "sequence", ["bad", "good"], seed=3)])
    monkeypatch.setattr(type(side.runtime.decoder()), "eos_ids", lambda self: set())
    app = create_app(side, ServeConfig(max_queue=2, request_timeout_s=60))
    scheduler = app.state.serve.scheduler
    step = scheduler._step
    scheduler._step = lambda batch: (time.sleep(0.05), step(batch))[1]
    body = {"prompts": ["the dog runs"], "max_new_tokens": 256}
    with serve_in_thread(app) as url, httpx.Client(base_url=url, timeout=60) as c:
        model = c.get("/v1/models").json()["data"][0]["id"]
        with c.stream("POST", "/generate/stream", json=body) as one, c.stream("POST", "/generate/stream",
                                                                               json=body) as two:
            assert one.status_code == two.status_code == 200
            # both running (each line iterator kept: dropped, it closes its connection, and the server, which
            # sees a hang-up at once, gives the slot back)
            lines = [one.iter_lines(), two.iter_lines()]
            next(lines[0]), next(lines[1])
            assert c.get("/health").json()["pending"] == 2
            refused = [c.post("/predict", json={"texts": ["the dog runs"]}), c.post("/generate/stream", json=body),
                       c.post("/v1/completions", json={"model": model, "prompt": "the dog", "max_tokens": 2})]
            assert [r.status_code for r in refused] == [503] * 3, [r.text[:200] for r in refused]
            for r in refused:
                assert "queue is full" in r.text and int(r.headers["retry-after"]) >= 1
        deadline = time.time() + 60
        while c.get("/health").json()["pending"]:  # each stream ends at its next decode step once its client left
            assert time.time() < deadline, c.get("/health").json()
            time.sleep(0.05)
        assert c.post("/predict", json={"texts": ["the dog runs"]}).status_code == 200
