"""Settings of `adalayers serve`, one pydantic field each: the field is the whole setting.

Its command-line flag (cli/serve.py builds them from these fields), type, default, bounds and help text
all come from the field:

    flag     --field-name without a trailing _s (max_wait_ms -> --max-wait-ms, request_timeout_s ->
             --request-timeout); a bool that is on by default: --no-field-name turns it off; or the
             field's json_schema_extra "flag" (num_threads -> --threads); its "aliases": more names of the
             same flag (llama-server's short ones: -c, -np, -t)
    metavar  SECONDS for a field ending in _s, else the json_schema_extra "metavar", else argparse's
    help     the field's description and its default; for a --no-NAME flag, the json_schema_extra "off":
             what turning the setting off does

A bad value is a ConfigError naming its flag, e.g. '--max-batch: must be at least 1, got 0'.
"""
from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from adalayers.config import one_line
from adalayers.errors import ConfigError
from adalayers.serve.guards import parse_rule


def serve_flag(name: str) -> str:
    """The `adalayers serve` flag of ServeConfig's field `name` (of an unknown name: --name, for its error)."""
    field = ServeConfig.model_fields.get(name)
    flag = (field and field.json_schema_extra or {}).get("flag")
    if flag:
        return flag
    plain = name.removesuffix("_s").replace("_", "-")
    return f"--no-{plain}" if field and field.annotation is bool and field.default is True else f"--{plain}"


def serve_metavar(name: str) -> str | None:
    """The flag's placeholder in --help: SECONDS for a field in seconds, else the field's own, if any."""
    return "SECONDS" if name.endswith("_s") else (ServeConfig.model_fields[name].json_schema_extra or {}).get("metavar")


class ServeConfig(BaseModel):
    """Settings of `adalayers serve` (not part of a run's config), declared and validated by pydantic:
    a bad value is a ConfigError naming its flag, e.g. '--max-batch: must be at least 1, got 0'."""
    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    host: str = Field("127.0.0.1", min_length=1, description="Address to listen on (0.0.0.0 exposes the service "
                                                               "to the network).")
    port: int = Field(8000, ge=0, le=65535, description="TCP port.")
    max_batch: int = Field(32, ge=1, description="Texts per base pass: concurrent requests are batched together "
                                                 "up to this.")
    max_wait_ms: float = Field(5.0, ge=0, description="How long the first waiting request waits for others to "
                                                      "join its batch.")
    max_texts: int = Field(64, ge=1, description="Texts per request; more is answered 413.")
    max_chars: int = Field(10_000, ge=1, description="Characters per text; longer is answered 413.")
    max_length: int | None = Field(None, ge=8, description="Tokens per text in the base pass (default: the "
                                                           "largest of the heads' model.max_length); longer texts "
                                                           "are truncated (token tasks: windows).")
    primary: bool = Field(True, description="Run the base to its end and return its own output; off: stop after "
                                            "the deepest layer any head uses (early exit).",
                          json_schema_extra={"off": "stop the base after the deepest layer any head uses (early "
                                                    "exit); answers then carry no base output (default: off, the "
                                                    "base runs to its end)"})
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto (CUDA when present), cpu or cuda.")
    num_threads: int | None = Field(None, ge=1, description="CPU threads: torch's, and the ONNX Runtime or llama.cpp "
                                                            "engine's (None = each one's default; llama.cpp's: "
                                                            "one per physical core, as llama-server's).",
                                    json_schema_extra={"flag": "--threads", "aliases": ["-t"]})
    ctx_size: int = Field(4096, ge=64, description="Context of the generations, in tokens (llama-server's --ctx-size): "
                                                   "a prompt and its max_tokens fit in it; on --runtime llama.cpp the "
                                                   "KV cache all running generations share (the passes of /predict "
                                                   "and /v1/embeddings get as much again beside it).",
                          json_schema_extra={"aliases": ["-c"], "metavar": "TOKENS"})
    parallel: int | None = Field(None, ge=1, description="Generations decoding together at most (llama-server's "
                                                         "--parallel slots); more wait in the queue (None: "
                                                         "--max-batch, and 16 on --runtime llama.cpp).",
                                 json_schema_extra={"aliases": ["-np"], "metavar": "N"})
    batch_size: int = Field(2048, ge=1, description="Prompt tokens prefilled between two decode steps of the running "
                                                    "generations at most (llama-server's --batch-size): waiting "
                                                    "prompts are prefilled in groups up to it and a longer prompt in "
                                                    "chunks of it; smaller: shorter stalls of the running streams, "
                                                    "earlier first tokens in a burst.",
                            json_schema_extra={"aliases": ["-b"], "metavar": "TOKENS"})
    pooling: Literal["mean", "last"] = Field("mean", description="/v1/embeddings of a decoder base (llama-server's "
                                                                 "--pooling): the mean of the last layer's states "
                                                                 "over the text's tokens, or the last token's state; "
                                                                 "L2-normalized.")
    max_tokens: int = Field(16_384, ge=1, description="Tokens per request (plain rows plus token-head windows); "
                                                      "more is answered 413.")
    max_batch_tokens: int = Field(16_384, ge=1, description="Tokens per base pass: a batch stops growing at this "
                                                            "many, or at one slice of work (--slice-ms) once the "
                                                            "base's speed is measured (one request may fill it "
                                                            "alone).")
    slice_ms: float = Field(500.0, gt=0, description="A request whose work would take the base longer than this "
                                                     "(at the tokens/s its passes have run so far) runs in slices "
                                                     "of whole texts of about this much work, each slice queued "
                                                     "behind the requests that arrived meanwhile: a short request "
                                                     "waits for one slice, not for a whole large request.")
    max_queue: int = Field(64, ge=1, description="Requests pending (queued or running); one more is answered 503 "
                                                 "with Retry-After.")
    request_timeout_s: float = Field(30.0, gt=0, description="Server-side deadline of a request from arrival to "
                                                             "answer; past it: 503.")
    read_timeout_s: float = Field(10.0, gt=0, description="A request's headers and body must arrive within this "
                                                          "many seconds (from the connection or the previous "
                                                          "answer); slower clients get 408.")
    keep_alive_s: int = Field(5, ge=1, description="An idle keep-alive connection is closed after this many "
                                                   "seconds (uvicorn).")
    api_key_file: str | None = Field(None, description="File holding the bearer token every request must send "
                                                       "(Authorization: Bearer TOKEN); ADALAYERS_API_KEY works too.",
                                     json_schema_extra={"metavar": "FILE"})
    api_key: str | None = Field(None, min_length=16, pattern=r"^[!-~]+$", description="The bearer token itself (llama-server's --api-key; "
                                                                "other users of the machine can read a command "
                                                                "line: --api-key-file keeps it off); one printable "
                                                                "word of 16 characters or more.",
                                json_schema_extra={"metavar": "KEY"})
    ui: bool = Field(True, description="Serve the playground page at GET / (heads, a text box, streamed "
                                       "generation); off: the API alone.",
                     json_schema_extra={"off": "leave out the playground page at GET / (default: served; see "
                                               "docs/serving.md)"})
    continuous_batching: bool = Field(True, description="Generations on the /v1 routes share decode steps: a new "
                                                        "request's rows join the running batch between two steps "
                                                        "(off: each request decodes alone, taking turns).",
                                      json_schema_extra={"off": "each generation on the /v1 routes decodes alone, "
                                                                "taking turns between steps (default: they share "
                                                                "decode steps, a new request joining between two)"})
    chat_template: str | None = Field(None, description="File holding a Jinja chat template for "
                                                        "/v1/chat/completions, in place of the base tokenizer's own "
                                                        "(for bases that have none, e.g. GGUF files).",
                                      json_schema_extra={"metavar": "FILE"})

    guard: list[str] | None = Field(None, description="A guard every request gets, whatever the client sends: "
                                                      "HEAD:LABEL>=P (that label at least probability P) or "
                                                      "HEAD>=V (a regression head); repeat for more "
                                                      "(docs/guards.md).",
                                    json_schema_extra={"metavar": "HEAD:LABEL>=P", "action": "append"})
    guard_message: str = Field("This request was stopped by the service's content guard.", min_length=1,
                               description="The refusal text of a generation a guard stopped (/v1 routes).",
                               json_schema_extra={"metavar": "TEXT"})
    guard_log: str | None = Field(None, description="Append every guard trip to this JSON Lines file (time, request "
                                                    "id, route, head, label, value, token position).",
                                  json_schema_extra={"metavar": "FILE"})
    guard_log_text: bool = Field(False, description="Write the text that tripped a guard into --guard-log too.")

    @field_validator("guard")
    @classmethod
    def _rules(cls, specs):
        for spec in specs or []:
            parse_rule(spec)  # ConfigError naming the rule
        return specs

    def __init__(self, **values):
        try:
            super().__init__(**values)
        except ValidationError as e:
            raise ConfigError(one_line(e, lambda loc: serve_flag(str(loc[0])) if loc else "serve")) from None

    def __setattr__(self, name, value):
        try:
            super().__setattr__(name, value)
        except ValidationError as e:
            raise ConfigError(one_line(e, lambda loc: serve_flag(name))) from None

    @classmethod
    def help(cls, name: str) -> str:
        """The help of the field's flag: its description and default; for a --no-NAME flag, what turning
        the setting off does (json_schema_extra "off")."""
        f = cls.model_fields[name]
        if serve_flag(name).startswith("--no-"):
            return (f.json_schema_extra or {}).get("off") or f"turn off: {f.description}"
        return f"{f.description} (default: {f.default})"
