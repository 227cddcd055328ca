"""Server-side guards on the llama.cpp runtime over real HTTP: a tiny F32 GGUF (tests/tinygguf.py) served by
`adalayers serve --runtime llama.cpp --guard acc:good>=0`, a rule every prompt trips after its prefill. Each
such request generates nothing and gives its llama.cpp sequences back (more requests than the context holds
sequences all answer, and /health counts every sequence free again); /metrics counts the stops."""
from __future__ import annotations

import httpx
import openai
import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (pip install 'adalayers[llamacpp]')")

from runs_util import ServeProcess, tiny_gguf_runs  # noqa: E402
from test_guards import started  # noqa: E402


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with tiny_gguf_runs(tmp_path_factory.mktemp("guards_llamacpp")) as runs:
        s = ServeProcess(runs["base"], [runs["acc"]], runs["root"], "--runtime", "llama.cpp",
                         "--guard", "acc:good>=0", "--max-wait-ms", "1")
        try:
            yield started(s)
        finally:
            s.stop()


def test_prompt_stops_on_llama_cpp_give_their_sequences_back(server):
    before = server.health()
    n = before["llamacpp_sequences"] + 2  # more stopped requests than the context has sequences
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=120)
    model = client.models.list().data[0].id
    for i in range(n):
        c = client.completions.create(model=model, prompt=f"the cat sat on the mat {i}", max_tokens=8)
        assert c.choices[0].finish_reason == "content_filter" and c.usage.completion_tokens == 0
    g = httpx.post(f"{server.url}/generate", json={"prompts": ["a man", "a dog"], "max_new_tokens": 4},
                   timeout=120).json()["results"]
    assert [r["finish"] for r in g] == ["guard", "guard"] and [r["tokens"] for r in g] == [0, 0]
    after = server.health()
    assert after["llamacpp_sequences_free"] == before["llamacpp_sequences_free"]
    assert after["guard_stops"] == {"acc:good": n + 2}
    metrics = httpx.get(f"{server.url}/metrics", timeout=10).text
    assert f'adalayers:guard_stops_total{{head="acc",label="good"}} {float(n + 2)}' in metrics
