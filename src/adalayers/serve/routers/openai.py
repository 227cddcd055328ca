"""OpenAI-compatible routes: what the `openai` client, chat UIs and agent frameworks already speak.

    GET  /v1/models            the base, and the sequence heads (the models /v1/classify takes)
    POST /v1/chat/completions  decoder bases: the conversation in the base's chat template, generated
    POST /v1/completions       decoder bases: the prompt(s) as given, generated
    POST /v1/classify          every sequence head, vLLM's shape (routers/pooling.py)
    POST /v1/embeddings        encoder bases: the sentence embedding /predict gives as "base" (routers/pooling.py)

Generation goes through the generation service, the one /generate uses (serve/generation.py: decode, admit
under --max-queue, first event within --request-timeout, then the rest or a stream); its events are shaped by
serve/completions.py. The request's options become GenerationParams once (serve/params.py). Side tasks are
opt-in per request through the extra body field "adalayers" (serve/protocol.py); without it the answer is what
an OpenAI client expects, nothing more. Every error on /v1/* is in OpenAI's shape {"error": {"message", "type",
"param", "code"}}: a route's through the route class (serve/errors.OpenAIRoute), and 401 and 413 from the
middlewares, 404 and 405 from the app's handler, by path (serve/shapes.py).
"""
from __future__ import annotations

import time
from dataclasses import replace

from fastapi import APIRouter, FastAPI
from fastapi.responses import JSONResponse

from adalayers.errors import AdaLayersError, ModelError
from adalayers.kinds import TaskKind
from adalayers.serve.budget import max_conversation_chars, max_messages
from adalayers.serve.completions import Completion
from adalayers.serve.errors import OpenAIError, OpenAIRoute, ServerError
from adalayers.serve.generation import GenerationService
from adalayers.serve.params import max_tokens_sent, openai_params
from adalayers.serve.protocol import ChatRequest, CompletionRequest, OpenAIRequest, unsupported
from adalayers.serve.state import ServeState
from adalayers.serve.validate import check_count, check_tasks, check_text, check_texts
from adalayers.data.templates import chat_text, read_chat_template
from adalayers.model.chat_templates import base_chat_template

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
MAX_STOPS = 4


def add_routes(app: FastAPI, state: ServeState) -> None:
    """GET /v1/models and the two generation routes (the pooling ones are routers/pooling.py)."""
    side, cfg, name, service = state.side, state.cfg, state.name, state.generation  # /generate's service, shared
    router, started = APIRouter(route_class=OpenAIRoute), int(time.time())
    try:  # --chat-template, else the tokenizer's own (None), else the GGUF file's; none: chat is a 400
        template, no_chat = base_chat_template(side.backbone.tokenizer, side.backbone.name,
                                               read_chat_template(cfg.chat_template)), None
    except ModelError as e:
        template, no_chat = None, str(e)

    def shape(chat: bool) -> Completion:
        return Completion(chat, name, side.backbone.fingerprint(), side.backbone.tokenizer, refusal=cfg.guard_message)

    @router.get("/v1/models")
    async def models():
        heads = [{"id": n, "object": "model", "created": started, "owned_by": "adalayers", "root": name,
                  "parent": name} for n, h in side.heads.items() if h.kind != TaskKind.TOKENS]
        return {"object": "list", "data": [{"id": name, "object": "model", "created": started,
                                            "owned_by": "adalayers", "root": name, "parent": None}] + heads}

    @router.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest):
        arrived = time.perf_counter()
        _check(req, side, name)
        params = openai_params(req, cfg.ctx_size)
        if no_chat:
            raise OpenAIError(400, no_chat, "model", "model_not_supported")
        prompt = _chat_prompt(req.messages, side, cfg, template)
        n = _fits(side, prompt, "the conversation", "messages", _asked(req, params), cfg.ctx_size)
        return await _complete(service, req, [prompt], shape(True), _to_room(req, params, [n], cfg), arrived)

    @router.post("/v1/completions")
    async def completions(req: CompletionRequest):
        arrived = time.perf_counter()
        _check(req, side, name)
        params = openai_params(req, cfg.ctx_size)
        prompts = _prompts(req.prompt, cfg)
        ns = [_fits(side, p, f"prompt {i + 1}", "prompt", _asked(req, params), cfg.ctx_size)
              for i, p in enumerate(prompts)]
        return await _complete(service, req, prompts, shape(False), _to_room(req, params, ns, cfg), arrived)

    app.include_router(router)


async def _complete(service: GenerationService, req: OpenAIRequest, prompts: list[str], shape: Completion, params,
                    arrived: float):
    """The generation service's one path; a bad request is a 400 before any token is generated. Its start (the
    prefill, after any wait for room) within --request-timeout, else 503 and the request leaves the queue; once
    it runs, it runs to its end (or until its client leaves), as OpenAI-style servers do."""
    shape.side_tasks, shape.stops = req.adalayers is not None, list(params.stop)
    shape.include_usage = bool(req.stream and req.stream_options and req.stream_options.include_usage)
    route = "/v1/chat/completions" if shape.chat else "/v1/completions"
    started = await service.begin(prompts, params, route, arrived, request_id=shape.id)
    if req.stream:
        return service.sse(started, shape.sse)
    return JSONResponse(await service.finish(started, shape.response,
                                             failed=lambda e: ServerError(f"generation failed: {e}")))


def _check(req: OpenAIRequest, side, name: str) -> None:
    """What every generation request must be: supported fields, this server's model, a decoder base,
    at most 4 non-empty stop strings, known side tasks (max_tokens: serve/params.py)."""
    problem = unsupported(req)
    if problem:
        raise problem
    if req.model != name:
        raise OpenAIError(404, f"the model {req.model!r} does not exist; this server generates with {name!r} "
                               "(GET /v1/models)", "model", "model_not_found")
    if not side.backbone.is_causal:
        raise OpenAIError(400, f"the base {name} is not a decoder LLM: it cannot generate (it serves "
                               "/v1/embeddings and /v1/classify)", "model", "unsupported_model")
    stops = req.stops()
    if len(stops) > MAX_STOPS or not all(stops):
        raise OpenAIError(400, f"stop takes at most {MAX_STOPS} non-empty strings, got {len(stops)}", "stop")
    if req.stream_options is not None and not req.stream:
        raise OpenAIError(400, "stream_options is only allowed when stream is true", "stream_options")
    opts = req.adalayers
    if opts is not None:
        check_tasks(side, (opts.tasks or []) + opts.answer_only + list(opts.guard or {}), "adalayers")


def _chat_prompt(messages: list[dict], side, cfg, template: str | None) -> str:
    """The conversation in the base's chat template, ready for the assistant's turn."""
    if not messages:
        raise OpenAIError(400, "messages is empty: give at least one message", "messages")
    if len(messages) > max_messages(cfg):
        raise OpenAIError(413, f"{len(messages)} messages; the limit is {max_messages(cfg)} (4 x --max-texts, "
                               "at least 256)", "messages")
    conversation, chars = [], 0
    for i, m in enumerate(messages):
        extra = sorted(set(m) - {"role", "content", "name"})
        if extra:
            raise OpenAIError(400, f"messages[{i}].{extra[0]} is not supported (text messages only)",
                              f"messages[{i}].{extra[0]}", "unsupported_parameter")
        if m.get("role") not in ROLES:
            raise OpenAIError(400, f"messages[{i}].role is {m.get('role')!r}; adalayers serve takes "
                                   f"{', '.join(ROLES)}", f"messages[{i}].role", "unsupported_value")
        conversation.append({"role": ROLES[m["role"]], "content": _content(m.get("content"), i, cfg)})
        chars += len(conversation[-1]["content"])
        if chars > max_conversation_chars(cfg):
            raise OpenAIError(413, f"the conversation passes {max_conversation_chars(cfg)} characters at "
                                   f"messages[{i}] (4 x --max-chars)", "messages")
    try:
        prompt = chat_text(side.backbone.tokenizer, conversation, template=template)
    except AdaLayersError as e:
        raise OpenAIError(400, f"the base's chat template: {e}; or use /v1/completions", "messages") from None
    return prompt


def _content(content, i: int, cfg) -> str:
    """A message's text: a string, or text parts [{"type": "text", "text": ...}] joined by newlines."""
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                   for p in content):
            raise OpenAIError(400, f"messages[{i}].content: only text parts ({{'type': 'text', 'text': ...}}) "
                                   "are supported", f"messages[{i}].content", "unsupported_value")
        content = "\n".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise OpenAIError(400, f"messages[{i}].content must be text", f"messages[{i}].content")
    check_text(content, cfg.max_chars, f"messages[{i}].content", f"messages[{i}].content", blank_ok=True)
    return content


def _prompts(prompt, cfg) -> list[str]:
    """The prompt(s) of /v1/completions: a string or a list of strings (token ids are not taken)."""
    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    check_count(prompts, cfg.max_texts, "prompts", "prompt", "prompt", field="prompt")
    if not all(isinstance(p, str) for p in prompts):
        raise OpenAIError(400, "prompts as token ids are not supported: give text", "prompt", "unsupported_value")
    check_texts(prompts, cfg.max_chars, "prompt", "prompt")
    return prompts


def _asked(req: OpenAIRequest, params) -> int | None:
    """The client's max_tokens (None where it sent none)."""
    return params.max_new_tokens if max_tokens_sent(req) else None


def _to_room(req: OpenAIRequest, params, prompt_tokens: list[int], cfg):
    """A max_tokens the client did not send (16, or 256 on chat) within the room its longest prompt leaves in
    the context: a default never makes a 400, the answer ends at `length` where the context does."""
    if max_tokens_sent(req):
        return params
    return replace(params, max_new_tokens=min(params.max_new_tokens, cfg.ctx_size - max(prompt_tokens)))


def _fits(side, text: str, what: str, param: str, new_tokens: int | None, ctx_size: int) -> int:
    """Refuse a prompt the base would read truncated (its tokens past the server's max length), or one whose
    answer of new_tokens (None: not sent, at least one) would not fit the context (--ctx-size). -> its tokens."""
    n = len(side.backbone.tokenizer(text)["input_ids"])
    if n > side.max_length:
        raise OpenAIError(400, f"{what} has {n} tokens; this server reads at most {side.max_length} "
                               "(--max-length, or the heads' model.max_length)", param, "context_length_exceeded")
    if new_tokens is None and n >= ctx_size:
        raise OpenAIError(400, f"{what} has {n} tokens; the context holds {ctx_size} (--ctx-size), which leaves no "
                               "room for an answer", param, "context_length_exceeded")
    if new_tokens is not None and n + new_tokens > ctx_size:
        raise OpenAIError(400, f"{what} has {n} tokens and max_tokens is {new_tokens}: {n + new_tokens} tokens; the "
                               f"context holds {ctx_size} (--ctx-size)", param, "context_length_exceeded")
    return n
