"""One OpenAI-style request's generation (infer/generate.stream's events) as OpenAI objects and chunks.

    non-stream: {"id", "object": "chat.completion" | "text_completion", "created", "model",
                 "system_fingerprint", "choices": [...], "usage": {...}}  (+ "adalayers" when asked)
    stream (server-sent events, one `data: {json}` each):
      1. chat: the assistant role (delta {"role": "assistant", "content": ""}) per choice, with the prompt's
         side-task predictions (from the prefill) when asked; completions: those predictions on a first
         chunk with text "" (only when side tasks are asked)
      2. one chunk per choice and generated token that adds text (text held back while it may be the
         start of a stop string); with "steps", one per token, carrying that token's head values
      3. per choice, its last chunk: the rest of its text, finish_reason, and the final side-task
         predictions on prompt + answer
      4. with stream_options.include_usage: a chunk with "choices": [] and the usage (as OpenAI sends it)
      5. data: [DONE]

finish_reason: "stop" (end-of-text token or a stop string), "length" (max_tokens), "content_filter"
(a guard stopped it: the choice, or its last chunk's delta, carries "refusal": the refusal text, --guard-message;
the text is what was generated up to the token that tripped it, "" when the prompt did). Side-task values ride in one extra top-level object, "adalayers":
{"choices": [{"index", "prompt_tasks", "tasks", "steps", "step", "values"}]} (the keys each chunk has).
"""
from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass, field
from typing import Iterator

from adalayers.infer.answers import AnswerText
from adalayers.serve.generation import frame
from adalayers.serve.shapes import error_body

log = logging.getLogger(__name__)

FINISH = {"eos": "stop", "stop": "stop", "length": "length", "guard": "content_filter"}


@dataclass
class Completion:
    """The OpenAI shape of one request: chat (one conversation) or text (one choice per prompt)."""
    chat: bool
    model: str
    fingerprint: str
    tokenizer: object
    side_tasks: bool = False      # the request asked for side tasks ("adalayers")
    stops: list[str] = field(default_factory=list)
    include_usage: bool = False
    refusal: str = ""             # said when a guard stopped a choice (serve/guards.py)
    id: str = ""
    created: int = 0

    def __post_init__(self):
        self.id = f"{'chatcmpl' if self.chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.created = int(time.time())

    # --- non-stream ---------------------------------------------------------------------------
    def response(self, events: Iterator[dict]) -> dict:
        """The whole answer, from every event of the generation."""
        prompt_ids, results = None, None
        for event in events:
            if event["event"] == "prompt":
                prompt_ids = event["token_ids"]
            elif event["event"] == "done":
                results = event["results"]
        choices = [self._choice(i, r) for i, r in enumerate(results)]
        out = {"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
               "created": self.created, "model": self.model, "choices": choices,
               "usage": _usage(prompt_ids, results), "system_fingerprint": self.fingerprint}
        if self.side_tasks:
            out["adalayers"] = {"choices": [{"index": i, "prompt_tasks": r["prompt_tasks"], "tasks": r["tasks"],
                                             **({"steps": r["steps"]} if "steps" in r else {})}
                                            for i, r in enumerate(results)]}
        return out

    def _choice(self, i: int, r: dict) -> dict:
        refusal = self.refusal if r["finish"] == "guard" else None
        if self.chat:
            return {"index": i, "message": {"role": "assistant", "content": r["text"], "refusal": refusal},
                    "logprobs": None, "finish_reason": FINISH[r["finish"]]}
        return {"index": i, "text": r["text"], "logprobs": None, "finish_reason": FINISH[r["finish"]],
                **({"refusal": refusal} if refusal else {})}

    # --- stream -------------------------------------------------------------------------------
    def sse(self, first: dict, events: Iterator[dict]) -> Iterator[str]:
        """Server-sent events from the prompt event (already read) and the rest of the generation."""
        prompt_ids = first["token_ids"]
        generated = [AnswerText(self.tokenizer, ids) for ids in prompt_ids]
        sent = [""] * len(prompt_ids)
        try:
            for i, tasks in enumerate(first["results"]):
                side = {"index": i, "prompt_tasks": tasks} if self.side_tasks else None
                if self.chat:
                    yield self._chunk(i, {"role": "assistant", "content": ""}, side=side)
                elif side:
                    yield self._chunk(i, "", side=side)
            for event in events:
                if event["event"] == "step":
                    yield from self._step(event, prompt_ids, generated, sent)
                elif event["event"] == "done":
                    yield from self._finish(event["results"], sent, prompt_ids)
        except Exception as e:  # noqa: BLE001  (the 200 is sent: the error becomes the stream's last event)
            log.error("a streamed completion failed: %s", e, exc_info=e)
            yield _data(error_body(500, f"generation failed: {type(e).__name__}: {e}"))
        yield "data: [DONE]\n\n"

    def _step(self, event: dict, prompt_ids, generated, sent) -> Iterator[str]:
        for i, tid in enumerate(event["ids"]):
            if tid is None:
                continue  # ended (end-of-text, stop string, guard) or padding
            text = generated[i].add(tid)
            visible = text[: len(text) - held_back(text, self.stops)]  # a stop string's start is never sent
            visible = visible.rstrip("\ufffd")  # an incomplete UTF-8 character waits too
            delta = visible[len(sent[i]):] if visible.startswith(sent[i]) else ""
            sent[i] += delta
            values = {n: v[i] for n, v in event["values"].items()} if self.side_tasks else {}
            if delta or values:
                side = {"index": i, "step": event["step"], "values": values} if values else None
                yield self._chunk(i, {"content": delta} if self.chat else delta, side=side)

    def _finish(self, results: list[dict], sent: list[str], prompt_ids) -> Iterator[str]:
        for i, r in enumerate(results):
            rest = r["text"][len(sent[i]):] if r["text"].startswith(sent[i]) else ""
            side = {"index": i, "tasks": r["tasks"]} if self.side_tasks else None
            delta = ({"content": rest} if rest else {}) if self.chat else rest
            refusal = self.refusal if r["finish"] == "guard" else None
            if refusal and self.chat:
                delta["refusal"] = refusal
            yield self._chunk(i, delta, FINISH[r["finish"]], side, refusal if not self.chat else None)
        if self.include_usage:
            chunk = self._envelope([])
            chunk["usage"] = _usage(prompt_ids, results)
            yield _data(chunk)

    def _envelope(self, choices: list) -> dict:
        out = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
               "created": self.created, "model": self.model, "system_fingerprint": self.fingerprint,
               "choices": choices}
        if self.include_usage:
            out["usage"] = None
        return out

    def _chunk(self, i: int, delta, finish: str | None = None, side: dict | None = None,
               refusal: str | None = None) -> str:
        choice = {"index": i, "delta": delta} if self.chat else {"index": i, "text": delta}
        if refusal:
            choice["refusal"] = refusal
        chunk = self._envelope([{**choice, "logprobs": None, "finish_reason": finish}])
        if side is not None:
            chunk["adalayers"] = {"choices": [side]}
        return _data(chunk)


def held_back(text: str, stops: list[str]) -> int:
    """Characters at the end of `text` that may be the start of a stop string (the longest suffix of `text`
    that is a proper prefix of one): what a stream holds back, however long the stop strings are."""
    for i in range(max(0, len(text) - max((len(s) for s in stops), default=1) + 1), len(text)):
        if any(s.startswith(text[i:]) for s in stops if text[i] == s[0]):
            return len(text) - i  # the earliest start is the longest match
    return 0


def _usage(prompt_ids: list[list[int]], results: list[dict]) -> dict:
    prompt = sum(len(ids) for ids in prompt_ids)
    completion = sum(r["tokens"] for r in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def _data(obj: dict) -> str:
    return frame(obj, ascii_only=False)
