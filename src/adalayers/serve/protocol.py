"""Request and response models of every route: /predict and /generate (adalayers' own), then the
OpenAI-compatible routes (/v1/*). Every request model is a FiniteRequest
(serve/limits.py): NaN, Infinity and over-deep JSON are refused before a route sees them.

The OpenAI requests follow OpenAI's chat completions, completions and embeddings APIs and vLLM's classify
API. What adalayers does not do is named, never ignored: a field it does not know, or a known one
set to what it does not support (n > 1, tools, logprobs, ...), is a 400 in OpenAI's error shape

    {"error": {"message": "...", "type": "invalid_request_error", "param": "n", "code": "unsupported_value"}}

Side tasks are asked for with one extra field, "adalayers" (the `openai` client's extra_body):

    {"adalayers": {"tasks": ["cola"], "steps": false, "guard": {"policy": {"label": "unsafe", "threshold": 0.9}},
                   "answer_only": ["policy"]}}
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from adalayers.serve.errors import OpenAIError
from adalayers.serve.limits import FiniteRequest

MAX_NEW_TOKENS = 256  # tokens a /generate request may ask for; a chat completion's default max_tokens


# --- /predict ---------------------------------------------------------------------------------------
class PredictRequest(FiniteRequest):
    texts: list[str | list[str]] = Field(description="Texts to run; each is split into words on whitespace for token "
                                                     "tasks. For heads trained on sentence pairs: [text, second] "
                                                     "lists, or texts plus text_pairs.")
    text_pairs: list[str] | None = Field(None, description="The second text of each text, for heads trained on "
                                                           "sentence pairs (or give [text, second] lists in texts).")
    tasks: list[str] | None = Field(None, description="Names of the side tasks to answer (default: all).")
    base: bool = Field(True, description="Include the base model's own output (e.g. its sentence embedding).")


class PredictResponse(BaseModel):
    results: list[dict] = Field(description="Per text: truncated, base (its own output) and tasks {name: prediction}.")


# --- /generate ---------------------------------------------------------------------------------------
class GuardRule(BaseModel):
    model_config = ConfigDict(extra="forbid")
    label: str = Field(description="Stop a prompt's generation once its head gives this label ...")
    threshold: float = Field(ge=0.0, le=1.0, description="... at least this probability.")


class GenerateRequest(FiniteRequest):
    prompts: list[str] = Field(description="Prompts, generated as one left-padded batch.")
    max_new_tokens: int = Field(32, ge=1, le=MAX_NEW_TOKENS, description="Tokens to generate per prompt at most.")
    tasks: list[str] | None = Field(None, description="Side tasks to answer (default: all).")
    do_sample: bool = Field(False, description="Sample instead of greedy decoding.")
    temperature: float = Field(1.0, gt=0.0, le=10.0)
    top_k: int = Field(0, ge=0, description="Sample among the k most likely tokens (0 = all).")
    seed: int | None = Field(None, ge=0, le=2 ** 64 - 1,
                             description="Seed of the sampling (same seed, same text); 0 to 2^64-1.")
    steps: bool = Field(False, description="Per generated token, the value of every sequence head.")
    answer_only: list[str] = Field([], description="Heads that read the generated answer alone, not the prompt.")
    guard: dict[str, GuardRule] | None = Field(None, description="{task: {label, threshold}}: a streaming guard.")


# --- /v1/* (OpenAI, vLLM) -----------------------------------------------------------------------------


class SideOptions(BaseModel):
    """The extra "adalayers" field: which side tasks to answer, and how."""
    model_config = ConfigDict(extra="forbid")
    tasks: list[str] | None = Field(None, description="Side tasks to answer (default: all).")
    steps: bool = Field(False, description="Per generated token, the value of every sequence head.")
    guard: dict[str, GuardRule] | None = Field(None, description="{task: {label, threshold}}: stop a completion "
                                                                 "(finish_reason content_filter) once that head "
                                                                 "gives the label at least that probability.")
    answer_only: list[str] = Field([], description="Heads that read the generated answer alone, not the prompt.")


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class OpenAIRequest(FiniteRequest):
    """Fields both generation routes share. Unknown fields are kept (extra="allow") so that the route
    can name them in a 400; known but unsupported ones are checked by `unsupported`."""
    model_config = ConfigDict(extra="allow")
    model: str
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    temperature: float | None = Field(None, ge=0.0, le=2.0, description="0: greedy decoding (default 1).")
    top_p: float | None = Field(None, gt=0.0, le=1.0, description="Nucleus sampling (default 1: off).")
    seed: int | None = Field(None, ge=-(2 ** 63), lt=2 ** 64)
    stop: str | list[str] | None = Field(None, description="Up to 4 strings that end the completion.")
    n: int | None = Field(None, ge=1)
    user: str | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict | None = None
    logprobs: bool | int | None = None
    ignore_eos: bool | None = Field(None, description="Generate max_tokens tokens, past the end-of-text token "
                                                      "(llama-server's and vLLM's field; for benchmarks).")
    adalayers: SideOptions | None = None

    def stops(self) -> list[str]:
        return [self.stop] if isinstance(self.stop, str) else list(self.stop or [])


class ChatRequest(OpenAIRequest):
    messages: list[dict] = Field(description="[{role: system|developer|user|assistant, content: text}, ...]")
    max_tokens: int | None = Field(None, ge=1)
    max_completion_tokens: int | None = Field(None, ge=1)
    top_logprobs: int | None = None
    tools: list | None = None
    tool_choice: str | dict | None = None
    functions: list | None = None
    function_call: str | dict | None = None
    response_format: dict | None = None
    parallel_tool_calls: bool | None = None


class CompletionRequest(OpenAIRequest):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = Field(None, ge=1, description="Default 16, as OpenAI's.")
    echo: bool | None = False
    suffix: str | None = None
    best_of: int | None = None


class EmbeddingRequest(FiniteRequest):
    model_config = ConfigDict(extra="allow")
    model: str
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None


class ClassifyRequest(FiniteRequest):
    model_config = ConfigDict(extra="allow")
    model: str = Field(description="The name of a sequence head (GET /v1/models lists them).")
    input: str | list[str] | list[list[str]] = Field(description="Texts, or [text, second] pairs for a pair head.")
    user: str | None = None


# what each field may be for adalayers to run it (the default, or these values); anything else is a 400
SUPPORTED = {"n": (1,), "presence_penalty": (0, 0.0), "frequency_penalty": (0, 0.0), "logit_bias": ({},),
             "logprobs": (False, 0), "top_logprobs": (0,), "tools": ([],), "tool_choice": ("none",),
             "functions": ([],), "function_call": ("none",), "response_format": ({"type": "text"},),
             "parallel_tool_calls": (False, True), "echo": (False,), "suffix": ("",), "best_of": (1,)}


def unsupported(req: BaseModel) -> OpenAIError | None:
    """The first field of `req` set to something adalayers does not do (None when all is supported)."""
    extra = sorted(req.model_extra or {})
    if extra:
        return OpenAIError(400, f"unsupported parameter: {extra[0]!r} (adalayers serve does not know it)",
                           extra[0], "unsupported_parameter")
    for name in req.model_fields_set:
        value = getattr(req, name)
        if name in SUPPORTED and value is not None and value not in SUPPORTED[name]:
            return OpenAIError(400, f"unsupported value of {name!r}: {value!r} (adalayers serve takes "
                                    f"{' or '.join(map(repr, SUPPORTED[name]))})", name, "unsupported_value")
    return None
