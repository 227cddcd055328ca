"""GenerationParams (infer/params.py) built once from any route's request, max_new_tokens bounded once by the
server's context (--ctx-size):

    params = generate_params(req, cfg.ctx_size)   # POST /generate, /generate/stream (GenerateRequest)
    params = openai_params(req, cfg.ctx_size)     # POST /v1/chat/completions, /v1/completions

The two give the same params for the same options: /generate's max_new_tokens, do_sample, temperature, top_k,
seed, tasks, steps, answer_only and guard are /v1's max_tokens (or max_completion_tokens), temperature (0:
greedy), top_p, seed and the "adalayers" field's tasks, steps, answer_only and guard. /v1 adds its stop
strings, ignore_eos and raw prompts (a rendered chat, or the prompt as given).
"""
from __future__ import annotations

from adalayers.infer.params import GenerationParams, Sampling
from adalayers.serve.errors import BadRequest
from adalayers.serve.protocol import MAX_NEW_TOKENS, ChatRequest, CompletionRequest, GenerateRequest, GuardRule


def bounded(asked: int, ctx_size: int, param: str) -> int:
    """max_new_tokens within the server's context: more is a 400 naming `param`."""
    if asked > ctx_size:
        raise BadRequest(f"{param} is {asked}; this server's context holds {ctx_size} tokens (--ctx-size), prompt "
                         "included", param, "context_length_exceeded")
    return asked


def _guard(rules: dict[str, GuardRule] | None) -> tuple:
    return tuple((n, (g.label, g.threshold)) for n, g in (rules or {}).items())


def generate_params(req: GenerateRequest, ctx_size: int) -> GenerationParams:
    return GenerationParams(
        max_new_tokens=bounded(req.max_new_tokens, ctx_size, "max_new_tokens"),
        tasks=None if req.tasks is None else tuple(req.tasks),
        sampling=Sampling(req.do_sample, req.temperature, req.top_k, 1.0, req.seed),
        steps=req.steps, answer_only=tuple(req.answer_only), guard=_guard(req.guard))


def openai_params(req: ChatRequest | CompletionRequest, ctx_size: int) -> GenerationParams:
    """OpenAI's defaults: temperature 1 (0: greedy), top_p 1; max_tokens 16 on completions, MAX_NEW_TOKENS on
    chat (at most the context); without "adalayers", no side task."""
    opts = req.adalayers
    asked, param = max_new_tokens(req, ctx_size)
    temperature = 1.0 if req.temperature is None else req.temperature
    return GenerationParams(
        max_new_tokens=bounded(asked, ctx_size, param),
        tasks=(None if opts.tasks is None else tuple(opts.tasks)) if opts else (),
        sampling=Sampling(temperature > 0, temperature or 1.0, 0, 1.0 if req.top_p is None else req.top_p,
                          req.seed),
        steps=bool(opts and opts.steps), answer_only=tuple(opts.answer_only) if opts else (),
        guard=_guard(opts.guard if opts else None), ignore_eos=bool(req.ignore_eos), stop=tuple(req.stops()),
        raw=True)


def max_tokens_sent(req: ChatRequest | CompletionRequest) -> bool:
    """The client set the answer's length (max_tokens, or max_completion_tokens on chat)."""
    return bool(req.max_tokens or isinstance(req, ChatRequest) and req.max_completion_tokens)


def max_new_tokens(req: ChatRequest | CompletionRequest, ctx_size: int) -> tuple[int, str]:
    """(max_completion_tokens, else max_tokens, else 16 (completions, as OpenAI) or MAX_NEW_TOKENS (chat, at
    most the context); the field that said it)."""
    chat = isinstance(req, ChatRequest)
    if chat and req.max_completion_tokens:
        return req.max_completion_tokens, "max_completion_tokens"
    return req.max_tokens or (min(MAX_NEW_TOKENS, ctx_size) if chat else 16), "max_tokens"
