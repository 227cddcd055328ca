"""`adalayers serve` as a drop-in LLM server (issue 52): no heads, the GGUF file's chat template, max_tokens up to
the context, embeddings of a decoder, /metrics, /health 503 while loading, llama-server's flag names.

Servers are `adalayers serve` under uvicorn in subprocesses on 127.0.0.1 (runs_util.ServeProcess), on tiny GGUF
files written by the test (tinygguf): one whose metadata holds a chat template (as an instruction-tuned model's
file does) and one without (as a pretrained base's). Clients: the real `openai` client and httpx.
"""
from __future__ import annotations

import math
import time

import httpx
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'adalayers[llamacpp]')")
openai = pytest.importorskip("openai")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from runs_util import ServeProcess  # noqa: E402
from tinygguf import write_tiny_llama  # noqa: E402

TEMPLATE = ("{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}assistant:{% endif %}")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("dropin")
    return {"root": root, "chat": write_tiny_llama(root / "tiny-chat.gguf", chat_template=TEMPLATE),
            "base": write_tiny_llama(root / "tiny-base.gguf", seed=1)}


def _watch_loading(server: ServeProcess) -> list[tuple[int, str]]:
    """(status, "status" field) of each /health answer from the start of `server` until its first 200; other routes
    answer 503 (or 200, once loaded) meanwhile."""
    seen = []
    deadline = time.time() + 180
    while time.time() < deadline and (not seen or seen[-1][0] != 200):
        assert server.proc.poll() is None, server.logfile.read_text()
        try:
            r = httpx.get(server.url + "/health", timeout=5)
            seen.append((r.status_code, r.json().get("status")))
            if r.status_code == 503:
                other = httpx.get(server.url + "/v1/models", timeout=5)
                assert other.status_code in (503, 200)
        except httpx.TransportError:
            time.sleep(0.01)
    return seen


@pytest.fixture(scope="module")
def started(files, tmp_path_factory):
    """No heads: the chat file on llama.cpp (llama-server's flag names) and on torch; the base file on torch.
    The torch server's /health is watched from its start (test_health_is_503_while_loading_then_200): it converts
    the GGUF file first, so its loading lasts long enough to be seen; the torch-free llama.cpp server of this tiny
    file may answer 200 at its first /health."""
    with pytest.MonkeyPatch.context() as mp:  # the torch runtime's conversion of the GGUF file goes here
        mp.setenv("ADALAYERS_CACHE", str(tmp_path_factory.mktemp("cache")))
        started = {"llama": ServeProcess(files["chat"], [], files["root"], "--runtime", "llama.cpp", "-c", "1024",
                                         "-np", "4"),
                   "torch": ServeProcess(files["chat"], [], files["root"], "--ctx-size", "1024"),
                   "base": ServeProcess(files["base"], [], files["root"], "--runtime", "llama.cpp")}
    try:
        loading = _watch_loading(started["torch"])
        yield {"servers": {k: s.wait_started() for k, s in started.items()}, "loading": loading}
    finally:
        for s in started.values():
            s.stop()


@pytest.fixture(scope="module")
def servers(started):
    return started["servers"]


def _client(server) -> "openai.OpenAI":
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", timeout=120, max_retries=0)


def _model(server) -> str:
    return httpx.get(server.url + "/v1/models", timeout=30).json()["data"][0]["id"]


@pytest.mark.parametrize("which", ["llama", "torch"])
def test_no_heads_answers_chat_completions_and_embeddings(servers, which):
    server = servers[which]
    client, model = _client(server), _model(server)
    assert [m.id for m in client.models.list().data] == [model] == ["tiny-chat.gguf"]
    chat = client.chat.completions.create(model=model, messages=[{"role": "user", "content": "the cat"}],
                                          max_tokens=5, temperature=0)
    assert chat.choices[0].finish_reason in ("length", "stop") and chat.usage.completion_tokens <= 5
    assert chat.usage.prompt_tokens >= len("user: the cat\nassistant:".split())  # the file's template, rendered
    assert chat.model_extra == {}
    text = client.completions.create(model=model, prompt="the cat sat", max_tokens=5, temperature=0)
    assert text.choices[0].text == client.completions.create(model=model, prompt="the cat sat", max_tokens=5,
                                                             temperature=0).choices[0].text
    chunks = list(client.completions.create(model=model, prompt="the cat sat", max_tokens=5, temperature=0,
                                            stream=True))
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text.choices[0].text
    emb = client.embeddings.create(model=model, input=["the cat sat", "a man in the other room"])
    vectors = [d.embedding for d in emb.data]
    assert len(vectors) == 2 and len(vectors[0]) == 64 and vectors[0] != vectors[1]
    assert all(math.isclose(math.fsum(x * x for x in v), 1.0, rel_tol=1e-4) for v in vectors)  # L2-normalized
    r = httpx.post(server.url + "/predict", json={"texts": ["the cat sat"]}, timeout=60)
    assert r.status_code == 200 and r.json()["results"][0]["tasks"] == {}


def test_both_runtimes_embed_alike(servers):
    """The llama.cpp runtime and the default one pool the same last state (llama.cpp's KV cache is f16)."""
    texts = ["the cat sat on the mat", "there"]
    a, b = ([d.embedding for d in _client(servers[k]).embeddings.create(model="tiny-chat.gguf", input=texts).data]
            for k in ("llama", "torch"))
    for u, v in zip(a, b):
        assert max(abs(x - y) for x, y in zip(u, v)) < 2e-2
        assert math.fsum(x * y for x, y in zip(u, v)) > 0.999


def test_base_without_chat_template_is_a_one_line_400(servers):
    server = servers["base"]
    with pytest.raises(openai.BadRequestError) as e:
        _client(server).chat.completions.create(model=_model(server), messages=[{"role": "user", "content": "hi"}])
    message = e.value.body["message"]
    assert "\n" not in message and "pretrained base model without a chat template" in message
    assert "/v1/completions" in message and "--chat-template" in message
    done = _client(server).completions.create(model=_model(server), prompt="the cat", max_tokens=3)
    assert done.usage.completion_tokens <= 3  # completions still answer


@pytest.mark.parametrize("which", ["llama", "torch"])
def test_max_tokens_above_256_is_honoured(servers, which):
    server = servers[which]
    client, model = _client(server), _model(server)
    done = client.completions.create(model=model, prompt="the cat", max_tokens=300, temperature=0,
                                     extra_body={"ignore_eos": True})
    assert done.usage.completion_tokens == 300 and done.choices[0].finish_reason == "length"
    with pytest.raises(openai.BadRequestError) as e:  # more than the context (--ctx-size 1024)
        client.completions.create(model=model, prompt="the cat", max_tokens=1025)
    assert "--ctx-size" in e.value.body["message"]


def _metrics(server) -> dict:
    r = httpx.get(server.url + "/metrics", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_parse_and_move(servers):
    server = servers["llama"]
    before = _metrics(server)
    key = ("adalayers:requests_total", (("route", "/v1/completions"), ("status", "200")))
    done = _client(server).completions.create(model=_model(server), prompt="the cat sat", max_tokens=7,
                                              extra_body={"ignore_eos": True}, stream=True)
    assert sum(1 for c in done if c.choices and c.choices[0].text) >= 1
    after = _metrics(server)
    assert after[key] == before.get(key, 0) + 1
    assert after[("adalayers:generation_tokens_total", ())] == before[("adalayers:generation_tokens_total", ())] + 7
    assert after[("adalayers:prompt_tokens_total", ())] > before[("adalayers:prompt_tokens_total", ())]
    ttft = ("adalayers:time_to_first_token_seconds_count", ())
    itl = ("adalayers:inter_token_latency_seconds_count", ())
    assert after[ttft] == before[ttft] + 1 and after[itl] == before[itl] + 6
    assert after[("adalayers:num_requests_running", ())] == 0
    assert after[("adalayers:num_requests_waiting", ())] == 0
    httpx.get(server.url + "/no-such-route", timeout=30)
    assert _metrics(server)[("adalayers:requests_total", (("route", "unmatched"), ("status", "404")))] >= 1


def test_health_is_503_while_loading_then_200(started):
    """As llama-server: the server binds first, /health answers 503 {"status": "loading"} until the base is
    loaded, then 200; other routes answer 503 meanwhile (_watch_loading, from the torch server's start; both
    runtimes load behind the same serve.app.Loading)."""
    seen = started["loading"]
    assert seen[0] == (503, "loading") and seen[-1] == (200, "ok"), seen
    assert {s for s, _ in seen} == {503, 200}


def test_llama_server_flag_names():
    from adalayers import cli
    from adalayers.serve.config import ServeConfig

    args = cli.build_parser().parse_args(["serve", "--base", "qwen2.5-0.5b", "-c", "8192", "-np", "4", "-t", "2",
                                          "--host", "127.0.0.1", "--port", "8080", "--api-key", "k" * 16,
                                          "--pooling", "last"])
    cfg = ServeConfig(**{n: getattr(args, n) for n in ServeConfig.model_fields})
    assert (cfg.ctx_size, cfg.parallel, cfg.num_threads, cfg.port, cfg.api_key, cfg.pooling) == \
        (8192, 4, 2, 8080, "k" * 16, "last")
    assert args.heads == []
    from adalayers.errors import ConfigError
    with pytest.raises(ConfigError, match="--pooling"):
        ServeConfig(pooling="cls")
