"""The HTTP service: good and bad requests (test client, and the same app on Ray Serve), micro-batching over real HTTP."""
import asyncio
import json
import socket

import httpx
import torch
import pytest
from fastapi.testclient import TestClient

from adalayers.serve.config import ServeConfig
from adalayers.infer.sidetasks import SideTasks
from adalayers.serve.app import create_app

from conftest import tiny_backbone, tiny_tokenizer
from runs_util import NER, make_run, serve_in_thread


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The tiny base saved as a model folder (Ray Serve replicas load it) and two heads trained on it."""
    base = tiny_backbone("bert", tiny_tokenizer())
    root = tmp_path_factory.mktemp("runs")
    base.model.save_pretrained(root / "base")
    base.tokenizer.save_pretrained(root / "base")
    heads = [make_run(root / "acc", base, "sequence", ["bad", "good"], seed=3),
             make_run(root / "ner", base, "token", NER, seed=4)]
    return base, str(root / "base"), [str(h) for h in heads]


@pytest.fixture(scope="module")
def side(runs):
    return SideTasks.from_backbone(runs[0], runs[2])


LIMITS = ServeConfig(max_texts=3, max_chars=50, max_wait_ms=1)


@pytest.fixture(scope="module", params=["app", pytest.param("ray-serve", marks=pytest.mark.ray)])
def client(request, side, runs):
    """The app in-process (FastAPI's test client), and the same app as a Ray Serve deployment over HTTP (on the
    session's local Ray, conftest.local_ray: these tests run last, with the other Ray tests)."""
    if request.param == "app":
        with TestClient(create_app(side, LIMITS)) as c:
            yield c
        return
    request.getfixturevalue("local_ray")
    from adalayers.serve import ray_serve

    port = _free_port()
    # deadlines far above a request's cost: a loaded machine (two busy cores, two replicas) must not fail the test
    cfg = LIMITS.model_copy(update={"port": port, "device": "cpu", "num_threads": 1, "request_timeout_s": 300.0})
    url = ray_serve.start(runs[1], runs[2], cfg, replicas=2)
    try:
        with httpx.Client(base_url=url, timeout=330) as c:
            yield c
    finally:
        from ray import serve

        serve.shutdown()


def test_predict_answers_every_text_from_one_pass(client, side):
    r = client.post("/predict", json={"texts": ["john sees the big dog", "a good movie"]})
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    direct = side.predict(["john sees the big dog", "a good movie"])
    assert [set(x["tasks"]) for x in results] == [{"acc", "ner"}] * 2
    for got, ref in zip(results, direct):
        assert got["tasks"]["acc"]["label"] == ref["tasks"]["acc"]["label"]
        assert got["tasks"]["acc"]["probabilities"]["good"] == pytest.approx(
            ref["tasks"]["acc"]["probabilities"]["good"], abs=1e-5)
        assert got["tasks"]["ner"]["tags"] == ref["tasks"]["ner"]["tags"]
        assert len(got["base"]["embedding"]) == side.backbone.hidden_size


def test_task_subset_and_no_base(client):
    r = client.post("/predict", json={"texts": ["a good movie"], "tasks": ["ner"], "base": False})
    assert r.status_code == 200, r.text
    (only,) = r.json()["results"]
    assert list(only["tasks"]) == ["ner"] and "base" not in only
    assert only["tasks"]["ner"]["words"] == ["a", "good", "movie"]


@pytest.mark.parametrize("body, status, says", [
    ({"texts": ["a", "b", "c", "d"]}, 413, "the limit is 3"),
    ({"texts": ["a good movie " * 10]}, 413, "text 1 has 130 characters; the limit is 50"),
    ({"texts": ["a good movie", " "]}, 422, "text 2 is empty"),
    ({"texts": []}, 422, "texts is empty"),
    ({"texts": ["a good movie"], "tasks": ["sentiment"]}, 400, "known tasks: acc, ner"),
    ({"texts": "a good movie"}, 422, "texts"),
    ({"texts": [3]}, 422, "texts"),
    ({"txts": ["a good movie"]}, 422, "texts"),
])
def test_bad_requests_say_what_is_wrong(client, body, status, says):
    r = client.post("/predict", json=body)
    assert r.status_code == status, r.text
    assert says in r.text


def test_malformed_json_is_422(client):
    r = client.post("/predict", content=b'{"texts": ["a good', headers={"content-type": "application/json"})
    assert r.status_code == 422
    assert "json" in r.text.lower()


def test_oversized_body_refused_before_reading(client):
    r = client.post("/predict", content=b"x" * 2_000_000, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "request body" in r.text


def test_tasks_health_and_openapi(client, side):
    tasks = client.get("/tasks").json()
    assert [t["name"] for t in tasks["tasks"]] == ["acc", "ner"]
    assert tasks["tasks"][1]["labels"] == NER
    assert sum(tasks["tasks"][0]["layer_weights"]) == pytest.approx(1.0, abs=1e-5)
    assert tasks["fingerprint"] == side.backbone.fingerprint()
    health = client.get("/health").json()
    assert health["status"] == "ok" and health["tasks"] == ["acc", "ner"]
    assert health["memory"]["rss_mb"] > 0  # the serving process's (under Ray Serve: a replica's)
    if isinstance(client, TestClient):  # the app runs in this process: 64 MB more, written to, shows in /health
        held = bytearray(64 * 2**20)
        held[::4096] = b"x" * len(held[::4096])
        after, before = client.get("/health").json()["memory"], health["memory"]
        grew = after["rss_mb"] - before["rss_mb"] > 60
        if after["heap_in_use_mb"] is not None:  # glibc
            assert after["heap_in_use_mb"] - before["heap_in_use_mb"] > 60
            # malloc may serve the 64 MB from memory it freed but kept resident: the RSS then stays
            assert grew or before["heap_free_mb"] > 60, (before, after)
        else:
            assert grew, (before, after)
        del held
    schema = client.get("/openapi.json").json()
    assert "/predict" in schema["paths"] and "PredictRequest" in schema["components"]["schemas"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_concurrent_requests_are_batched_over_real_http(side):
    app = create_app(side, ServeConfig(max_batch=64, max_wait_ms=300))
    with serve_in_thread(app, log_level="warning") as url:
        texts = [f"john sees the {w} dog" for w in ("big", "small", "good", "bad", "great", "terrible")]

        async def clients():
            async with httpx.AsyncClient(base_url=url, timeout=30) as c:
                answers = await asyncio.gather(*[c.post("/predict", json={"texts": [t], "tasks": ["acc"]})
                                                 for t in texts])
                return answers, (await c.get("/health")).json()

        answers, health = asyncio.run(clients())
        direct = side.predict(texts, tasks=["acc"])
        for a, ref in zip(answers, direct):
            assert a.status_code == 200
            (got,) = a.json()["results"]
            assert got["tasks"]["acc"]["probabilities"]["good"] == pytest.approx(
                ref["tasks"]["acc"]["probabilities"]["good"], abs=1e-5)
        assert health["requests_answered"] == len(texts)
        assert health["batches_run"] < len(texts)  # several requests shared a pass


def test_a_head_producing_nan_fails_only_its_own_requests(tokenizer, tmp_path):
    """A batch that fails is rerun request by request: only the request asking the broken head gets the
    error (500, naming it, never a NaN in JSON); the others in its batch are answered."""
    base = tiny_backbone("bert", tokenizer)
    side = SideTasks.from_backbone(base, [make_run(tmp_path / "acc", base, "sequence", ["bad", "good"], seed=3),
                                          make_run(tmp_path / "broken", base, "sequence", ["x", "y"], seed=5)])
    with torch.no_grad():
        for p in side.heads["broken"].task.head.parameters():
            p.fill_(float("nan"))
    app = create_app(side, ServeConfig(max_batch=64, max_wait_ms=300))
    with serve_in_thread(app, log_level="critical") as url:

        async def clients():
            async with httpx.AsyncClient(base_url=url, timeout=30) as c:
                good = [c.post("/predict", json={"texts": [f"a good movie {w}"], "tasks": ["acc"]})
                        for w in ("big", "small", "dog", "cat")]
                return await asyncio.gather(*good, c.post("/predict", json={"texts": ["a movie"]})), \
                    (await c.get("/health")).json()

        answers, health = asyncio.run(clients())
        assert [a.status_code for a in answers[:4]] == [200] * 4
        assert answers[4].status_code == 500 and "'broken' produced non-finite values" in answers[4].text


def test_request_whose_client_hung_up_while_checked_is_never_queued(side):
    """The whole body, then the hang-up, before the handler has queued the request: it is dropped unqueued
    (no worker runs here, so a queued request would stay in the queue)."""
    app = create_app(side, LIMITS)
    batcher = app.state.batcher
    body = json.dumps({"texts": ["john sees the dog"]}).encode()
    messages = [{"type": "http.request", "body": body, "more_body": False}, {"type": "http.disconnect"}]
    sent = []

    async def receive():
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": "/predict", "raw_path": b"/predict", "query_string": b"", "root_path": "",
             "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
             "client": ("127.0.0.1", 1), "server": ("127.0.0.1", 2)}
    asyncio.run(app(scope, receive, send))
    assert (batcher.gone, batcher.dropped, batcher.queue.qsize(), batcher.pending) == (1, 1, 0, 0)
    assert sent == []  # nobody to answer: dropped unparsed, before any handler (serve/budget.py)
