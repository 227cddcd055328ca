"""Server-side guards (`adalayers serve --guard`, serve/guards.py) over real HTTP: `adalayers serve` under
uvicorn in a subprocess on 127.0.0.1, a tiny random Llama with two sequence heads, spoken to by the real
`openai` client and httpx. Two servers: one whose rule trips at a generated token of the test prompt (chosen
from that prompt's per-step values in this process), one whose rule trips on every prompt (threshold 0).
What the server answers is checked against SideTasks.generate with the same rule, in this process."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from adalayers.errors import ConfigError
from adalayers.infer.sidetasks import SideTasks
from adalayers.serve.guards import GuardPolicy, parse_rule
from runs_util import ServeProcess, make_run
from tinydecoders import TINY_CHAT, chat_decoder_folder

CHAT = TINY_CHAT
MODEL = "tiny-llama-guard"
MESSAGES = [{"role": "user", "content": "the dog runs quickly"}]
RENDERED = "<s>they love the dog runs quickly . it is"  # CHAT on MESSAGES (checked in test_rendered)
NEW = 8
MESSAGE = "Refused by the test guard."


def started(server: ServeProcess, tries: int = 3) -> ServeProcess:
    """server.wait_started(), for up to `tries` of its waits: a busy shared machine loads the base slowly (a
    server that exits fails at once, with its log)."""
    for i in range(tries):
        try:
            return server.wait_started()
        except AssertionError:
            if i == tries - 1 or server.proc.poll() is not None:
                raise
    return server


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("guards")
    base = root / MODEL
    bb = chat_decoder_folder(base)
    heads = [make_run(root / "acc", bb, "sequence", ["bad", "good"], seed=3),
             make_run(root / "pol", bb, "sequence", ["safe", "unsafe"], seed=5)]
    return {"root": root, "base": base, "heads": heads}


@pytest.fixture(scope="module")
def side(folders):
    return SideTasks.load(str(folders["base"]), [str(h) for h in folders["heads"]])


@pytest.fixture(scope="module")
def rule(side):
    """(head, label, threshold) that the test prompt does not trip but one of its generated tokens does,
    and the generation SideTasks gives under it (finish "guard" at token k >= 1)."""
    ref = side.generate([RENDERED], max_new_tokens=NEW, steps=True, raw=True)[0]
    for head in ("pol", "acc"):
        labels = side.heads[head].task.labels
        for j, label in enumerate(labels):
            steps = [v[j] for v in ref["steps"][head]]
            before = ref["prompt_tasks"][head]["probabilities"][label]
            peak = max(steps)
            if peak > before + 1e-4:
                threshold = (peak + max([before] + [s for s in steps if s < peak])) / 2
                want = side.generate([RENDERED], max_new_tokens=NEW, raw=True, guard={head: (label, threshold)})[0]
                if want["finish"] == "guard" and want["tokens"] >= 1:
                    return head, label, threshold, want
    pytest.fail(f"no label's value rises above its prompt value while generating: {ref['steps']}")


@pytest.fixture(scope="module")
def servers(folders, rule):
    head, label, threshold, _ = rule
    root = folders["root"]
    step = ServeProcess(folders["base"], folders["heads"], root, "--guard", f"{head}:{label}>={threshold!r}",
                        "--guard-message", MESSAGE, "--guard-log", str(root / "step.jsonl"), "--max-wait-ms", "1")
    prompt = ServeProcess(folders["base"], folders["heads"], root, "--guard", "pol:unsafe>=0",
                          "--guard-log", str(root / "prompt.jsonl"), "--guard-log-text", "--max-wait-ms", "1")
    try:
        yield {"step": started(step), "prompt": started(prompt)}
    finally:
        step.stop()
        prompt.stop()


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=60)


def _log(folders, name: str) -> list[dict]:
    return [json.loads(line) for line in (folders["root"] / name).read_text().splitlines()]


def test_rendered(side):
    tok = side.backbone.tokenizer
    assert tok.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) == RENDERED


def test_rules_parse_and_refuse_bad_ones(side):
    assert str(parse_rule("pol:unsafe>=0.8")) == "pol:unsafe>=0.8" and parse_rule("score>=2.5").label is None
    for bad, words in (("pol", "expected HEAD:LABEL>=P"), ("pol:unsafe>=1.5", "probability"),
                       ("pol:unsafe>=x", "not a number")):
        with pytest.raises(ConfigError, match=words):
            parse_rule(bad)
    from adalayers.serve.config import ServeConfig
    for bad, words in ((["nope:x>=0.5"], "no head 'nope'"), (["pol:maybe>=0.5"], "has the labels safe, unsafe"),
                       (["pol>=0.5"], "has the labels")):
        with pytest.raises(ConfigError, match=words):
            GuardPolicy.from_config(ServeConfig(guard=bad), side)


def test_a_client_that_sends_no_guard_is_stopped_mid_answer(servers, rule, folders):
    head, label, threshold, want = rule
    client = _client(servers["step"])
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=NEW, temperature=0)
    assert r.choices[0].finish_reason == "content_filter" and r.choices[0].message.refusal == MESSAGE
    assert r.choices[0].message.content == want["text"] and r.usage.completion_tokens == want["tokens"] >= 1
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=NEW, temperature=0,
                                                 stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == want["text"]
    assert chunks[-1].choices[0].finish_reason == "content_filter" and chunks[-1].choices[0].delta.refusal == MESSAGE
    c = client.completions.create(model=MODEL, prompt=RENDERED, max_tokens=NEW, temperature=0)
    assert c.choices[0].finish_reason == "content_filter" and c.choices[0].text == want["text"]
    assert c.choices[0].model_extra["refusal"] == MESSAGE and c.usage.completion_tokens == want["tokens"]
    chunks = list(client.completions.create(model=MODEL, prompt=RENDERED, max_tokens=NEW, temperature=0, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == want["text"]
    assert chunks[-1].choices[0].finish_reason == "content_filter"
    g = httpx.post(f"{servers['step'].url}/generate", json={"prompts": [RENDERED], "max_new_tokens": NEW},
                   timeout=60).json()["results"][0]
    assert g["finish"] == "guard" and g["text"] == want["text"] and g["tokens"] == want["tokens"]
    assert g["guard"] == {"head": head, "label": label, "value": pytest.approx(want["guard"]["value"], abs=1e-5),
                          "token": want["tokens"]}
    with httpx.stream("POST", f"{servers['step'].url}/generate/stream",
                      json={"prompts": [RENDERED], "max_new_tokens": NEW}, timeout=60) as s:
        events = [line for line in s.iter_lines() if line.startswith("data: ")]
    assert json.loads(events[-1][6:])["results"][0]["finish"] == "guard"
    log = _log(folders, "step.jsonl")
    assert [x["route"] for x in log] == ["/v1/chat/completions"] * 2 + ["/v1/completions"] * 2 + \
        ["/generate", "/generate/stream"]
    assert all(x["head"] == head and x["label"] == label and x["token"] == want["tokens"] and "text" not in x
               and x["value"] >= threshold for x in log)
    assert log[0]["request_id"] == r.id and len({x["request_id"] for x in log}) == len(log)
    stops = servers["step"].health()["guard_stops"]
    assert stops == {f"{head}:{label}": 6}
    metrics = httpx.get(f"{servers['step'].url}/metrics", timeout=10).text
    assert f'adalayers:guard_stops_total{{head="{head}",label="{label}"}} 6.0' in metrics


def test_a_client_cannot_switch_it_off(servers, rule, side):
    head, label, threshold, want = rule
    other = next(lab for lab in side.heads[head].task.labels if lab != label)
    loose = {head: {"label": label, "threshold": 1.0}}  # the client's own rule on the same head never trips
    r = _client(servers["step"]).chat.completions.create(
        model=MODEL, messages=MESSAGES, max_tokens=NEW, temperature=0,
        extra_body={"adalayers": {"tasks": [], "guard": loose}})
    assert r.choices[0].finish_reason == "content_filter" and r.usage.completion_tokens == want["tokens"]
    g = httpx.post(f"{servers['step'].url}/generate", json={"prompts": [RENDERED], "max_new_tokens": NEW,
                                                             "tasks": ["acc" if head == "pol" else "pol"],
                                                             "guard": {head: {"label": other, "threshold": 1.0}}},
                   timeout=60).json()["results"][0]
    assert g["finish"] == "guard" and g["tokens"] == want["tokens"]


def test_a_prompt_that_trips_it_generates_nothing(servers, folders):
    client = _client(servers["prompt"])
    r = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=NEW, temperature=0)
    assert r.choices[0].finish_reason == "content_filter" and r.usage.completion_tokens == 0
    assert r.choices[0].message.content == "" and r.choices[0].message.refusal
    chunks = list(client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=NEW, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[-1].usage.completion_tokens == 0 and chunks[-2].choices[0].finish_reason == "content_filter"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ""
    c = client.completions.create(model=MODEL, prompt=["a dog", "a cat"], max_tokens=NEW)
    assert [ch.finish_reason for ch in c.choices] == ["content_filter"] * 2 and c.usage.completion_tokens == 0
    g = httpx.post(f"{servers['prompt'].url}/generate", json={"prompts": ["a dog"], "max_new_tokens": NEW},
                   timeout=60).json()["results"][0]
    assert g["finish"] == "guard" and g["tokens"] == 0 and g["text"] == "" and g["guard"]["token"] == 0
    log = _log(folders, "prompt.jsonl")
    assert len(log) == 5 and all(x["token"] == 0 and x["head"] == "pol" and "text" in x for x in log)
    assert log[-1]["text"].startswith("a dog")


def test_predict_and_classify_mark_the_rows_that_trip_it(servers, side):
    url = servers["prompt"].url
    res = httpx.post(f"{url}/predict", json={"texts": ["a dog", "a cat"], "tasks": ["acc"]}, timeout=60).json()
    for row in res["results"]:
        assert list(row["tasks"]) == ["acc"]  # the guard head ran, and is not shown where it was not asked
        assert row["guard"][0]["head"] == "pol" and row["guard"][0]["label"] == "unsafe"
    want = side.predict(["a dog"], tasks=["pol"])[0]["tasks"]["pol"]["probabilities"]["unsafe"]
    assert res["results"][0]["guard"][0]["value"] == pytest.approx(want, abs=1e-5)
    c = httpx.post(f"{url}/v1/classify", json={"model": "acc", "input": ["a dog"]}, timeout=60).json()
    assert c["data"][0]["guard"][0]["head"] == "pol"
