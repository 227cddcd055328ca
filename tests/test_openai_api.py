"""The OpenAI-compatible routes, spoken to by the real `openai` client (sync and async, streaming and not)
against `adalayers serve` under uvicorn in a subprocess on 127.0.0.1: a tiny random Llama with a chat
template and two chat-template heads (with an API key), and a tiny random BERT with a sequence, a token
and a sentence-pair regression head (for /v1/classify and /v1/embeddings). Side-task values are checked
against SideTasks.generate / /predict run on the same folders in this process."""
from __future__ import annotations

import asyncio
import time

import httpx
import openai
import pytest

from adalayers.model.backbone import Backbone
from adalayers.infer.sidetasks import SideTasks
from adalayers.data.templates import chat_text
from runs_util import NER, ServeProcess, make_run
from tinydecoders import TINY_CHAT, chat_decoder_folder
from tinymodels import tiny_bert

KEY = "openai-test-key-0123"  # at least 16 characters (serve/auth.py)
CHAT = TINY_CHAT
CONTENT = "the dog runs quickly"
MODEL = "tiny-llama-chat"
MESSAGES = [{"role": "user", "content": CONTENT}]
TOP = {"id", "object", "created", "model", "choices", "usage", "system_fingerprint"}
CTX = 64  # the context of servers["small_ctx"]


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("openai")
    base = root / MODEL
    bb = chat_decoder_folder(base)
    heads = [make_run(root / "acc", bb, "sequence", ["bad", "good"], seed=3, template="chat"),
             make_run(root / "pol", bb, "sequence", ["safe", "unsafe"], seed=5, template="chat")]
    enc = tiny_bert(root / "tiny-bert")
    ebb = Backbone.load(str(enc))
    enc_heads = [make_run(root / "cola", ebb, "sequence", ["no", "yes"], seed=3),
                 make_run(root / "ner", ebb, "token", NER, seed=4),
                 make_run(root / "sim", ebb, "regression", [], seed=6, pairs=True)]
    (root / "key").write_text(KEY)
    return {"root": root, "base": base, "heads": heads, "enc": enc, "enc_heads": enc_heads}


@pytest.fixture(scope="module")
def servers(folders):
    """Started side by side: the decoder (with an API key) and the encoder, waited for here, and the decoder with
    no heads in a context of CTX tokens, waited for by the one test that uses it
    (test_a_max_tokens_not_sent_fits_the_room_the_prompt_leaves)."""
    dec = ServeProcess(folders["base"], folders["heads"], folders["root"], "--api-key-file",
                       str(folders["root"] / "key"), "--max-chars", "200", "--max-wait-ms", "1")
    enc = ServeProcess(folders["enc"], folders["enc_heads"], folders["root"], "--max-wait-ms", "1")
    small = ServeProcess(folders["base"], [], folders["root"], "--ctx-size", str(CTX), "--max-length", "128",
                         "--max-wait-ms", "1")
    try:
        yield {"dec": dec.wait_started(), "enc": enc.wait_started(), "small_ctx": small}
    finally:
        dec.stop()
        enc.stop()
        small.stop()


@pytest.fixture(scope="module")
def side(folders):
    return SideTasks.load(str(folders["base"]), [str(h) for h in folders["heads"]])


@pytest.fixture(scope="module")
def client(servers):
    return openai.OpenAI(base_url=f"{servers['dec'].url}/v1", api_key=KEY, max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def aclient_url(servers):
    return f"{servers['dec'].url}/v1"


def _close(a: dict, b: dict, tol: float = 1e-5) -> None:
    """Two side-task outputs ({task: {label, probabilities}}) agree."""
    assert a.keys() == b.keys()
    for name in a:
        assert a[name]["label"] == b[name]["label"]
        assert a[name]["probabilities"] == pytest.approx(b[name]["probabilities"], abs=tol)


def _flat(rows: list[list[float]]) -> list[float]:
    return [x for row in rows for x in row]


def test_models_lists_the_base_and_the_sequence_heads(client):
    ids = [m.id for m in client.models.list().data]
    assert ids == [MODEL, "acc", "pol"]


def test_chat_without_side_tasks_is_exactly_openai_shaped(client, servers, side):
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0)
    ref = side.generate([CONTENT], max_new_tokens=6, tasks=[])[0]
    assert r.model_extra == {} and r.choices[0].message.content == ref["text"]
    assert r.choices[0].finish_reason == {"length": "length", "eos": "stop"}[ref["finish"]]
    prompt = chat_text(side.backbone.tokenizer, MESSAGES)
    n_prompt = len(side.backbone.tokenizer(prompt)["input_ids"])
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (n_prompt, ref["tokens"])
    assert r.usage.total_tokens == n_prompt + ref["tokens"]
    raw = httpx.post(f"{servers['dec'].url}/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"},
                     json={"model": MODEL, "messages": MESSAGES, "max_tokens": 3}, timeout=60).json()
    assert set(raw) == TOP and raw["object"] == "chat.completion"
    assert set(raw["choices"][0]) == {"index", "message", "logprobs", "finish_reason"}
    assert set(raw["choices"][0]["message"]) == {"role", "content", "refusal"}
    assert set(raw["usage"]) == {"prompt_tokens", "completion_tokens", "total_tokens"}


def test_chat_side_tasks_equal_sidetasks_generate_for_the_same_prompt_and_seed(client, side):
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0.8, seed=11,
                                       extra_body={"adalayers": {"steps": True}})
    ref = side.generate([CONTENT], max_new_tokens=6, steps=True, do_sample=True, temperature=0.8, seed=11)[0]
    assert r.choices[0].message.content == ref["text"]
    got = r.model_extra["adalayers"]["choices"][0]
    _close(got["prompt_tasks"], ref["prompt_tasks"])
    _close(got["tasks"], ref["tasks"])
    for name in ("acc", "pol"):
        assert _flat(got["steps"][name]) == pytest.approx(_flat(ref["steps"][name]), abs=1e-5)
    # the prompt's values are what the heads give on the rendered conversation alone
    _close(got["prompt_tasks"], side.predict([CONTENT])[0]["tasks"])


def test_chat_stream_event_order_with_side_tasks(client, side):
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=6, temperature=0,
                                                 stream=True, extra_body={"adalayers": {"steps": True}}))
    ref = side.generate([CONTENT], max_new_tokens=6, steps=True)[0]
    assert all(len(c.choices) == 1 for c in chunks)  # never an empty choices list
    first, last = chunks[0], chunks[-1]
    assert first.choices[0].delta.role == "assistant"
    _close(first.model_extra["adalayers"]["choices"][0]["prompt_tasks"], ref["prompt_tasks"])
    steps = [c.model_extra["adalayers"]["choices"][0] for c in chunks[1:-1]]
    assert [s["step"] for s in steps] == list(range(ref["tokens"]))
    assert _flat([s["values"]["acc"] for s in steps]) == pytest.approx(_flat(ref["steps"]["acc"]), abs=1e-5)
    assert [c.choices[0].finish_reason for c in chunks[:-1]] == [None] * (len(chunks) - 1)
    assert last.choices[0].finish_reason == {"length": "length", "eos": "stop"}[ref["finish"]]
    _close(last.model_extra["adalayers"]["choices"][0]["tasks"], ref["tasks"])
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ref["text"]


def test_async_completions_stream_and_not_with_usage(aclient_url, side):
    prompt = chat_text(side.backbone.tokenizer, MESSAGES)  # the text the chat-template heads read
    ref = side.generate([CONTENT], max_new_tokens=5)[0]

    async def run():
        async with openai.AsyncOpenAI(base_url=aclient_url, api_key=KEY, max_retries=0, timeout=60) as c:
            whole = await c.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0)
            parts = [x async for x in await c.completions.create(model=MODEL, prompt=prompt, max_tokens=5,
                                                                 temperature=0, stream=True,
                                                                 stream_options={"include_usage": True})]
            side_tasks = await c.completions.create(model=MODEL, prompt=prompt, max_tokens=5, temperature=0,
                                                    extra_body={"adalayers": {"tasks": ["pol"]}})
            return whole, parts, side_tasks

    whole, parts, side_tasks = asyncio.run(run())
    assert whole.model_extra == {} and whole.choices[0].text == ref["text"]
    assert all(len(p.choices) == 1 and p.usage is None for p in parts[:-1])
    assert parts[-1].choices == [] and parts[-1].usage == whole.usage
    assert "".join(p.choices[0].text for p in parts[:-1]) == ref["text"]
    assert all("adalayers" not in (p.model_extra or {}) for p in parts)
    got = side_tasks.model_extra["adalayers"]["choices"][0]
    _close(got["prompt_tasks"], {"pol": ref["prompt_tasks"]["pol"]})
    _close(got["tasks"], {"pol": ref["tasks"]["pol"]})


def test_async_chat_stream(aclient_url, side):
    async def run():
        async with openai.AsyncOpenAI(base_url=aclient_url, api_key=KEY, max_retries=0, timeout=60) as c:
            stream = await c.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4, temperature=0,
                                                     stream=True)
            return [x async for x in stream]

    chunks = asyncio.run(run())
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == side.generate([CONTENT], 4, tasks=[])[0]["text"]
    assert chunks[-1].choices[0].finish_reason is not None


def test_a_guard_that_fires_ends_with_content_filter(client, side):
    ref = side.generate([CONTENT], max_new_tokens=8, steps=True)[0]
    unsafe = [v[1] for v in ref["steps"]["pol"]]
    threshold = max(unsafe) - 1e-5  # fires at the step where "unsafe" peaks
    guarded = side.generate([CONTENT], max_new_tokens=8, guard={"pol": ("unsafe", threshold)})[0]
    assert guarded["finish"] == "guard"
    body = {"adalayers": {"guard": {"pol": {"label": "unsafe", "threshold": threshold}}}}
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0, extra_body=body)
    assert r.choices[0].finish_reason == "content_filter"
    assert r.choices[0].message.content == guarded["text"] and r.usage.completion_tokens == guarded["tokens"]
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=0,
                                                 stream=True, extra_body=body))
    assert chunks[-1].choices[0].finish_reason == "content_filter"
    _close(chunks[-1].model_extra["adalayers"]["choices"][0]["tasks"], guarded["tasks"])


def test_seed_reproduces_a_sampled_answer(client, side):
    def ask(seed):
        return client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=1.0,
                                              top_p=0.9, seed=seed).choices[0].message.content

    a, b, c = ask(1), ask(1), ask(2)
    assert a == b != c
    assert a == side.generate([CONTENT], 8, tasks=[], do_sample=True, temperature=1.0, top_p=0.9, seed=1)[0]["text"]


def test_stop_cuts_the_answer_before_the_stop_string(client, side):
    full = side.generate([CONTENT], 8, tasks=[], do_sample=True, temperature=1.0, seed=3)[0]["text"]
    stop = " " + full.split()[2]
    expected = full[: full.index(stop)]
    kw = dict(model=MODEL, messages=MESSAGES, max_tokens=8, temperature=1.0, seed=3, stop=[stop, "never seen"])
    r = client.chat.completions.create(**kw)
    assert (r.choices[0].message.content, r.choices[0].finish_reason) == (expected, "stop")
    cut = side.generate([CONTENT], 8, tasks=[], do_sample=True, temperature=1.0, seed=3, stop=[stop])[0]
    assert cut["text"] == expected and cut["finish"] == "stop"
    assert r.usage.completion_tokens == cut["tokens"] < 8  # the tokens kept and the one that completed the stop
    chunks = list(client.chat.completions.create(stream=True, **kw))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == expected
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.parametrize("kw,param", [({"n": 2}, "n"), ({"logprobs": True}, "logprobs"),
                                      ({"tools": [{"type": "function", "function": {"name": "f"}}]}, "tools"),
                                      ({"max_tokens": 100000}, "max_tokens"),
                                      ({"extra_body": {"adalayers": {"tasks": ["nope"]}}}, "adalayers")])
def test_unsupported_options_are_400_in_openai_shape(client, kw, param):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, **kw)
    assert e.value.param == param and e.value.type == "invalid_request_error"
    assert set(e.value.response.json()["error"]) == {"message", "type", "param", "code"}


def test_errors_of_every_layer_are_in_openai_shape(client, servers):
    wrong = openai.OpenAI(base_url=f"{servers['dec'].url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as e:
        wrong.chat.completions.create(model=MODEL, messages=MESSAGES)
    assert e.value.code == "invalid_api_key"
    r = httpx.get(f"{servers['dec'].url}/v1/models")  # no key at all
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.UnprocessableEntityError) as e:
        client.chat.completions.create(model=MODEL, messages=MESSAGES, temperature=3)
    assert e.value.param == "temperature"
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "a " * 150}])
    assert e.value.status_code == 413 and "limit is 200" in e.value.message
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES)
    assert e.value.code == "model_not_found"
    r = httpx.post(f"{servers['dec'].url}/v1/completions", content=b"x" * 2_000_000,
                   headers={"Authorization": f"Bearer {KEY}", "content-type": "application/json"}, timeout=30)
    assert r.status_code == 413 and "the limit is" in r.json()["error"]["message"]


def test_classify_equals_predict_for_every_sequence_head(servers):
    url = servers["enc"].url
    texts = ["john sees the big dog", "a cat"]
    got = httpx.post(f"{url}/v1/classify", json={"model": "cola", "input": texts}, timeout=30).json()
    pred = httpx.post(f"{url}/predict", json={"texts": texts, "tasks": ["cola"]}, timeout=30).json()["results"]
    assert [d["index"] for d in got["data"]] == [0, 1] and got["usage"]["prompt_tokens"] > 0
    for d, p in zip(got["data"], pred):
        assert d["label"] == p["tasks"]["cola"]["label"] and d["num_classes"] == 2
        assert d["probs"] == [p["tasks"]["cola"]["probabilities"][lab] for lab in ("no", "yes")]
    pairs = [["john sees the dog", "mary sees a cat"]]
    got = httpx.post(f"{url}/v1/classify", json={"model": "sim", "input": pairs}, timeout=30).json()
    pred = httpx.post(f"{url}/predict", json={"texts": pairs, "tasks": ["sim"]}, timeout=30).json()["results"]
    assert got["data"][0]["probs"] == [pred[0]["tasks"]["sim"]["value"]] and got["data"][0]["num_classes"] == 1
    r = httpx.post(f"{url}/v1/classify", json={"model": "ner", "input": texts}, timeout=30)
    assert r.status_code == 404 and "cola, sim" in r.json()["error"]["message"]


def test_embeddings_equal_predicts_base_output(servers):
    url = servers["enc"].url
    c = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
    model = c.models.list().data[0].id
    texts = ["john sees the big dog", "a cat"]
    pred = httpx.post(f"{url}/predict", json={"texts": texts}, timeout=30).json()["results"]
    got = c.embeddings.create(model=model, input=texts)  # the client asks for base64 floats by default
    assert [d.embedding for d in got.data] == [pytest.approx(p["base"]["embedding"], abs=1e-6) for p in pred]
    exact = c.embeddings.create(model=model, input=texts[0], encoding_format="float")
    assert exact.data[0].embedding == pred[0]["base"]["embedding"] and exact.usage.prompt_tokens > 0
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model=model, messages=MESSAGES)
    assert "not a decoder LLM" in e.value.message


def test_chat_template_file_for_a_base_without_one(tmp_path):
    """--chat-template: a base whose tokenizer has no chat template (as gemma3-270m's GGUF) chats with the
    given one; an unreadable file is refused at start in one line."""
    from adalayers.serve.config import ServeConfig
    from adalayers.errors import ConfigError
    from adalayers.serve.app import create_app
    from runs_util import serve_in_thread
    from tinydecoders import decoder_backbone

    base = decoder_backbone("llama")  # no chat template
    side = SideTasks.from_backbone(base, [make_run(tmp_path / "acc", base, "sequence", ["bad", "good"], seed=3)])
    template = tmp_path / "chat.jinja"
    template.write_text("{{ bos_token }}{% for m in messages %}she loves {{ m['content'] }} .{% endfor %} it is")
    with serve_in_thread(create_app(side, ServeConfig(chat_template=str(template)))) as url:
        c = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0)
        r = c.chat.completions.create(model="tiny-llama", messages=MESSAGES, max_tokens=4, temperature=0)
    rendered = chat_text(base.tokenizer, MESSAGES, template=template.read_text())
    assert rendered == f"she loves {CONTENT} . it is"  # the tokenizer prepends BOS itself: never two
    assert r.choices[0].message.content == side.generate([rendered], 4, tasks=[])[0]["text"]
    assert r.usage.prompt_tokens == len(base.tokenizer(rendered)["input_ids"])
    with pytest.raises(ConfigError, match="--chat-template .*nope.jinja: cannot read it"):
        create_app(side, ServeConfig(chat_template=str(tmp_path / "nope.jinja")))


def test_generations_are_bounded_and_a_client_that_leaves_frees_its_slot(tmp_path):
    """--max-queue generations at once (one more: 503 in OpenAI's shape); a stream whose client leaves
    gives its slot back, so the next request runs."""
    from adalayers.serve.batcher import MicroBatcher
    from adalayers.serve.config import ServeConfig
    from adalayers.serve.app import create_app
    from runs_util import serve_in_thread
    from tinydecoders import decoder_backbone

    batcher = MicroBatcher(None, 1, 0.0, max_queue=1)  # what the generation service admits through
    release = batcher.admit()
    assert batcher.admit() is None and batcher.refused == 1 and batcher.retry_after_s() >= 1
    release()
    release()  # twice: counted once
    assert batcher.pending == 0
    assert batcher.admit() is not None
    base = decoder_backbone("llama")
    side = SideTasks.from_backbone(base, [make_run(tmp_path / "acc", base, "sequence", ["bad", "good"], seed=3)])
    body = {"model": "tiny-llama", "prompt": "the dog", "max_tokens": 256, "stream": True,
            "adalayers": {"steps": True}}
    with serve_in_thread(create_app(side, ServeConfig(max_queue=1))) as url, httpx.Client(base_url=url) as c:
        for _ in range(3):
            with c.stream("POST", "/v1/completions", json=body, timeout=30) as s:
                assert s.status_code == 200
                next(s.iter_lines())  # leaves after the first event
            for _ in range(200):  # the slot comes back once the server sees the client gone
                r = c.post("/v1/completions", json={**body, "stream": False, "max_tokens": 2}, timeout=30)
                if r.status_code != 503:
                    break
                assert r.json()["error"]["type"] == "server_error" and r.headers["retry-after"]
                time.sleep(0.05)
            assert r.status_code == 200, r.text


def test_a_max_tokens_not_sent_fits_the_room_the_prompt_leaves(servers, side):
    """A completion or chat without max_tokens whose prompt leaves less than the default (16, 256) in the context
    is answered up to the context's end (`length`), not refused; a max_tokens the client sent past it is a 400
    naming it; a prompt that fills the context is a 400 saying so."""
    count = lambda t: len(side.backbone.tokenizer(t)["input_ids"])  # noqa: E731
    ctx = CTX
    prompt = "the dog"
    while count(prompt + " runs") < ctx - 6:
        prompt += " runs"
    n = count(prompt)
    assert ctx - 16 < n < ctx
    server = servers["small_ctx"]  # --ctx-size CTX, no heads (started beside the module's other servers)
    try:
        c = openai.OpenAI(base_url=f"{server.wait_started().url}/v1", api_key="unused", max_retries=0, timeout=60)
        r = c.completions.create(model=MODEL, prompt=prompt, temperature=0, extra_body={"ignore_eos": True})
        assert r.usage.prompt_tokens == n and r.usage.completion_tokens == ctx - n
        assert r.choices[0].finish_reason == "length"
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model=MODEL, prompt=prompt, max_tokens=16)
        assert (e.value.code, e.value.param) == ("context_length_exceeded", "prompt")
        assert "max_tokens is 16" in str(e.value)
        long = prompt + " runs" * (ctx - n + 1)
        assert count(long) >= ctx
        with pytest.raises(openai.BadRequestError) as e:
            c.completions.create(model=MODEL, prompt=long)
        assert e.value.code == "context_length_exceeded" and "no room for an answer" in str(e.value)
        chat = c.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}], temperature=0,
                                         extra_body={"ignore_eos": True})
        assert chat.usage.prompt_tokens + chat.usage.completion_tokens == ctx
        assert chat.choices[0].finish_reason == "length"
    finally:
        server.stop()
