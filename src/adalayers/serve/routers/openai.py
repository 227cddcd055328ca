"""OpenAI-compatible routes: what the `openai` client, chat UIs and agent frameworks already speak.

    GET  /v1/models            the base, and the sequence heads (the models /v1/classify takes)
    POST /v1/chat/completions  decoder bases: the conversation in the base's chat template, generated
    POST /v1/completions       decoder bases: the prompt(s) as given, generated
    POST /v1/classify          every sequence head, vLLM's shape (routers/pooling.py)
    POST /v1/embeddings        encoder bases: the sentence embedding /predict gives as "base" (routers/pooling.py)

Generation goes through the service's decoder, the one /generate uses (ServeState.decode: the
continuous-batching scheduler of serve/scheduler.py, or infer/generate.stream per request with
--no-continuous-batching); its events are shaped by serve/completions.py. Side tasks are opt-in per request through the extra body field
"adalayers" (serve/protocol.py); without it the answer is what an OpenAI client expects, nothing more.
Every error on /v1/* (401 and 413 from the middlewares, 422 from validation, 503 when busy) is in
OpenAI's shape {"error": {"message", "type", "param", "code"}}; at most --max-queue generations run at once.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
import weakref

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, StreamingResponse

from adalayers.errors import AdaLayersError, ModelError
from adalayers.kinds import TaskKind
from adalayers.serve.completions import Completion
from adalayers.serve.deadlines import within
from adalayers.serve.protocol import (ChatRequest, CompletionRequest, OpenAIError, OpenAIRequest, error_body,
                                      max_new_tokens, unsupported)
from adalayers.serve.state import ServeState
from adalayers.data.templates import base_chat_template, chat_text, read_chat_template
from adalayers.textcheck import text_problem

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
MAX_STOPS = 4


def add_routes(app: FastAPI, state: ServeState) -> None:
    """GET /v1/models and the two generation routes (the pooling ones are routers/pooling.py)."""
    side, cfg, name, generate = state.side, state.cfg, state.name, state.decode  # /generate's decoder, shared
    install_errors(app)
    slots, started = Slots(cfg.max_queue, state.batcher), int(time.time())
    try:  # --chat-template, else the tokenizer's own (None), else the GGUF file's; none: chat is a 400
        template, no_chat = base_chat_template(side.backbone.tokenizer, side.backbone.name,
                                               read_chat_template(cfg.chat_template)), None
    except ModelError as e:
        template, no_chat = None, str(e)

    @app.get("/v1/models")
    async def models():
        heads = [{"id": n, "object": "model", "created": started, "owned_by": "adalayers", "root": name,
                  "parent": name} for n, h in side.heads.items() if h.kind != TaskKind.TOKENS]
        return {"object": "list", "data": [{"id": name, "object": "model", "created": started,
                                            "owned_by": "adalayers", "root": name, "parent": None}] + heads}

    @app.post("/v1/chat/completions")
    async def chat_completions(req: ChatRequest):
        _check(req, side, name, cfg.ctx_size)
        if no_chat:
            raise OpenAIError(400, no_chat, "model", "model_not_supported")
        prompt = _chat_prompt(req.messages, side, cfg, template)
        _fits(side, prompt, "the conversation", "messages", max_new_tokens(req, cfg.ctx_size), cfg.ctx_size)
        return await _generate(generate, slots, req, [prompt], Completion(True, name, side.backbone.fingerprint(),
                                                                           side.backbone.tokenizer),
                               cfg.request_timeout_s, cfg.ctx_size)

    @app.post("/v1/completions")
    async def completions(req: CompletionRequest):
        _check(req, side, name, cfg.ctx_size)
        prompts = _prompts(req.prompt, cfg)
        for i, p in enumerate(prompts):
            _fits(side, p, f"prompt {i + 1}", "prompt", max_new_tokens(req, cfg.ctx_size), cfg.ctx_size)
        return await _generate(generate, slots, req, prompts, Completion(False, name, side.backbone.fingerprint(),
                                                                          side.backbone.tokenizer),
                               cfg.request_timeout_s, cfg.ctx_size)


def install_errors(app: FastAPI) -> None:
    """Every error on /v1/* in OpenAI's shape (once per app, whichever /v1 router comes first): the
    middleware is added after the app's others, so it is outermost and sees their 401 and 413 too."""
    if getattr(app.state, "openai_errors", False):
        return
    app.state.openai_errors = True
    app.add_middleware(OpenAIErrors)
    app.add_exception_handler(OpenAIError, _error_response)


class Slots:
    """At most `limit` generations at once; one more is a 503 with Retry-After. With the service's batcher
    (serve/batcher.Batcher.admit), generations count under --max-queue together with /predict's requests and
    /generate's, as one queue."""

    def __init__(self, limit: int, batcher=None):
        self.limit, self.active, self._lock = limit, 0, threading.Lock()
        self.batcher = batcher if hasattr(batcher, "admit") else None

    def take(self):
        """A slot, or OpenAIError 503; returns its release function (safe to call twice)."""
        if self.batcher is not None:
            release = self.batcher.admit()
            if release is None:
                raise OpenAIError(503, f"the queue is full ({self.batcher.max_queue} requests pending, --max-queue); "
                                       "retry later", headers={"Retry-After": str(self.batcher.retry_after_s())})
            return release
        with self._lock:
            if self.active >= self.limit:
                raise OpenAIError(503, f"{self.active} generations are running (--max-queue {self.limit}); "
                                       "retry later", headers={"Retry-After": "1"})
            self.active += 1
        held = [True]

        def release():
            with self._lock:
                if held[0]:
                    held[0], self.active = False, self.active - 1
        return release


def _check(req: OpenAIRequest, side, name: str, ctx_size: int) -> None:
    """What every generation request must be: supported fields, this server's model, a decoder base,
    at most 4 non-empty stop strings, known side tasks."""
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
        unknown = [t for t in (opts.tasks or []) + opts.answer_only + list(opts.guard or {}) if t not in side.heads]
        if unknown:
            raise OpenAIError(400, f"unknown side task(s): {', '.join(unknown)}; known: {', '.join(side.names)}",
                              "adalayers")
    max_new_tokens(req, ctx_size)


def _chat_prompt(messages: list[dict], side, cfg, template: str | None) -> str:
    """The conversation in the base's chat template, ready for the assistant's turn."""
    if not messages:
        raise OpenAIError(400, "messages is empty: give at least one message", "messages")
    conversation = []
    for i, m in enumerate(messages):
        extra = sorted(set(m) - {"role", "content", "name"})
        if extra:
            raise OpenAIError(400, f"messages[{i}].{extra[0]} is not supported (text messages only)",
                              f"messages[{i}].{extra[0]}", "unsupported_parameter")
        if m.get("role") not in ROLES:
            raise OpenAIError(400, f"messages[{i}].role is {m.get('role')!r}; adalayers serve takes "
                                   f"{', '.join(ROLES)}", f"messages[{i}].role", "unsupported_value")
        conversation.append({"role": ROLES[m["role"]], "content": _content(m.get("content"), i, cfg)})
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
    if len(content) > cfg.max_chars:
        raise OpenAIError(413, f"messages[{i}].content has {len(content)} characters; the limit is "
                               f"{cfg.max_chars} (--max-chars)", f"messages[{i}].content")
    problem = text_problem(content)
    if problem and content and problem != "is empty":
        raise OpenAIError(422, f"messages[{i}].content {problem}", f"messages[{i}].content")
    return content


def _prompts(prompt, cfg) -> list[str]:
    """The prompt(s) of /v1/completions: a string or a list of strings (token ids are not taken)."""
    prompts = [prompt] if isinstance(prompt, str) else list(prompt)
    if not prompts:
        raise OpenAIError(400, "prompt is empty: give at least one prompt", "prompt")
    if not all(isinstance(p, str) for p in prompts):
        raise OpenAIError(400, "prompts as token ids are not supported: give text", "prompt", "unsupported_value")
    if len(prompts) > cfg.max_texts:
        raise OpenAIError(413, f"{len(prompts)} prompts in one request; the limit is {cfg.max_texts} (--max-texts)",
                          "prompt")
    for i, p in enumerate(prompts):
        if len(p) > cfg.max_chars:
            raise OpenAIError(413, f"prompt {i + 1} has {len(p)} characters; the limit is {cfg.max_chars} "
                                   "(--max-chars)", "prompt")
        problem = text_problem(p)
        if problem:
            raise OpenAIError(422, f"prompt {i + 1} {problem}", "prompt")
    return prompts


def _fits(side, text: str, what: str, param: str, new_tokens: int, ctx_size: int) -> None:
    """Refuse a prompt the base would read truncated (its tokens past the server's max length), or one whose
    answer of new_tokens would not fit the context (--ctx-size)."""
    n = len(side.backbone.tokenizer(text)["input_ids"])
    if n > side.max_length:
        raise OpenAIError(400, f"{what} has {n} tokens; this server reads at most {side.max_length} "
                               "(--max-length, or the heads' model.max_length)", param, "context_length_exceeded")
    if n + new_tokens > ctx_size:
        raise OpenAIError(400, f"{what} has {n} tokens and max_tokens is {new_tokens}: {n + new_tokens} tokens; the "
                               f"context holds {ctx_size} (--ctx-size)", param, "context_length_exceeded")


async def _generate(generate, slots: Slots, req: OpenAIRequest, prompts: list[str], shape: Completion,
                    timeout_s: float, ctx_size: int):
    """Run `generate` (Scheduler.stream, or infer/generate.stream) for the prompts; a bad request is a 400
    before any token is generated. Its start (the prefill, after any wait for room) within timeout_s
    (--request-timeout), else 503 and the request leaves the queue; once it runs, it runs to its end (or until
    its client leaves), as OpenAI-style servers do."""
    arrived = time.perf_counter()
    opts = req.adalayers
    shape.side_tasks, shape.stops = opts is not None, req.stops()
    shape.include_usage = bool(req.stream and req.stream_options and req.stream_options.include_usage)
    kwargs = dict(max_new_tokens=max_new_tokens(req, ctx_size), tasks=opts.tasks if opts else [], **req.sampling(),
                  ignore_eos=bool(req.ignore_eos),
                  stop=shape.stops, raw=True, steps=bool(opts and opts.steps),
                  answer_only=opts.answer_only if opts else [],
                  guard={n: (g.label, g.threshold) for n, g in ((opts.guard or {}) if opts else {}).items()})
    release, events = slots.take(), None
    late = OpenAIError(503, f"not answered within {timeout_s:g} s (--request-timeout); retry later",
                       headers={"Retry-After": "1"})
    try:  # the prefill runs here: a bad request is answered before the response starts
        events = generate(prompts, **kwargs)
        ok, first = await within(lambda: next(events), events, timeout_s - (time.perf_counter() - arrived),
                                 lambda: _close(events, release))
    except AdaLayersError as e:
        _close(events, release)
        raise OpenAIError(400, str(e), "adalayers") from None
    except BaseException:
        _close(events, release)
        raise
    if not ok:
        raise late
    if not req.stream:
        try:
            body = await asyncio.to_thread(shape.response, itertools.chain([first], events))
        except AdaLayersError as e:
            raise OpenAIError(500, f"generation failed: {e}") from None
        finally:
            release()
        return JSONResponse(body)

    def sse():  # iterated in a worker thread by Starlette; closing it ends the generation
        try:
            yield from shape.sse(first, events)
        finally:
            events.close()
            release()

    body = sse()
    weakref.finalize(body, release)  # a stream never started still gives its slot back
    return StreamingResponse(body, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _close(events, release) -> None:
    if events is not None:
        events.close()
    release()


async def _error_response(_request: Request, exc: OpenAIError) -> JSONResponse:
    return JSONResponse(status_code=exc.status, content=exc.body(), headers=exc.headers)


class OpenAIErrors:
    """ASGI middleware: on /v1/* paths, an error answer of any layer ({"detail": ...} from the API key
    check, the body limit, validation, 404/405) is rewritten into OpenAI's error shape."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            return await self.app(scope, receive, send)
        start, body = None, b""

        async def reshaping_send(message):
            nonlocal start, body
            if message["type"] == "http.response.start" and message["status"] >= 400:
                start = message
                return
            if start is None or message["type"] != "http.response.body":
                return await send(message)
            body += message.get("body", b"")
            if message.get("more_body"):
                return
            new = json.dumps(_reshape(start["status"], body)).encode()
            headers = [(k, v) for k, v in start["headers"] if k.lower() not in (b"content-length", b"content-type")]
            await send({**start, "headers": headers + [(b"content-type", b"application/json"),
                                                       (b"content-length", str(len(new)).encode())]})
            await send({"type": "http.response.body", "body": new})

        await self.app(scope, receive, reshaping_send)


def _reshape(status: int, body: bytes) -> dict:
    """An error body (FastAPI's {"detail": str | [validation errors]}, or text) in OpenAI's shape."""
    try:
        data = json.loads(body)
    except ValueError:
        return error_body(status, body.decode("utf-8", "replace").strip() or f"HTTP {status}")
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        return data  # already in shape
    detail = data.get("detail") if isinstance(data, dict) else data
    param = None
    if isinstance(detail, list) and detail and isinstance(detail[0], dict):  # pydantic: the first problem
        loc = [str(x) for x in detail[0].get("loc", [])[1:]]
        param = ".".join(loc) or None
        detail = f"{param + ': ' if param else ''}{detail[0].get('msg', 'invalid value')}"
    code = "invalid_api_key" if status == 401 else "model_not_found" if status == 404 and param == "model" else None
    return error_body(status, str(detail), param, code)
