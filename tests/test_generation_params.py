"""GenerationParams built once from any route's request (serve/params.py): /generate's body and a /v1 chat body
that ask for the same options give the same params; max_new_tokens is bounded once, by --ctx-size."""
from __future__ import annotations

import pytest

from adalayers.infer.params import GenerationParams, Sampling
from adalayers.serve.errors import BadRequest
from adalayers.serve.params import generate_params, openai_params
from adalayers.serve.protocol import ChatRequest, CompletionRequest, GenerateRequest

GUARD = {"policy": {"label": "unsafe", "threshold": 0.9}}


def test_generate_and_chat_bodies_give_the_same_params():
    native = GenerateRequest.model_validate({"prompts": ["hi"], "max_new_tokens": 8, "tasks": ["cola"],
                                             "do_sample": True, "temperature": 0.7, "seed": 3, "steps": True,
                                             "answer_only": ["policy"], "guard": GUARD})
    chat = ChatRequest.model_validate({"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                       "max_tokens": 8, "temperature": 0.7, "seed": 3,
                                       "adalayers": {"tasks": ["cola"], "steps": True, "answer_only": ["policy"],
                                                     "guard": GUARD}})
    a, b = generate_params(native, 4096), openai_params(chat, 4096)
    assert a == GenerationParams(8, ("cola",), Sampling(True, 0.7, 0, 1.0, 3), True, ("policy",),
                                 (("policy", ("unsafe", 0.9)),))
    assert b.raw and not a.raw  # a chat's prompt is the rendered conversation, read as it is
    from dataclasses import replace
    assert replace(b, raw=False) == a
    assert a.guards == {"policy": ("unsafe", 0.9)}


def test_openai_defaults():
    chat = openai_params(ChatRequest.model_validate({"model": "m", "messages": []}), 4096)
    assert chat.max_new_tokens == 256 and chat.tasks == () and chat.sampling == Sampling(True, 1.0, 0, 1.0, None)
    greedy = openai_params(CompletionRequest.model_validate({"model": "m", "prompt": "a", "temperature": 0,
                                                             "stop": "x", "ignore_eos": True,
                                                             "adalayers": {}}), 4096)
    assert greedy.max_new_tokens == 16 and greedy.tasks is None and not greedy.sampling.do_sample
    assert greedy.stop == ("x",) and greedy.ignore_eos
    assert openai_params(ChatRequest.model_validate({"model": "m", "messages": []}), 100).max_new_tokens == 100
    assert GenerationParams.of(4, ["a"], guard={"a": ("x", 0.5)}, top_p=0.9) == GenerationParams(
        4, ("a",), Sampling(top_p=0.9), guard=(("a", ("x", 0.5)),))


@pytest.mark.parametrize("body,param", [({"max_tokens": 5000}, "max_tokens"),
                                        ({"max_completion_tokens": 5000, "max_tokens": 8}, "max_completion_tokens")])
def test_max_tokens_past_the_context_is_one_400(body, param):
    req = ChatRequest.model_validate({"model": "m", "messages": [], **body})
    with pytest.raises(BadRequest, match=rf"^{param} is 5000; this server's context holds 4096 tokens") as e:
        openai_params(req, 4096)
    assert (e.value.status, e.value.param, e.value.code) == (400, param, "context_length_exceeded")
    with pytest.raises(BadRequest, match="max_new_tokens is 200; this server's context holds 100"):
        generate_params(GenerateRequest.model_validate({"prompts": ["a"], "max_new_tokens": 200}), 100)
