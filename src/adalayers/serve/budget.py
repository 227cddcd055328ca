"""Work per request bounded by its size in bytes, before anything parses or validates it.

A JSON body's cost is not its length: 0.2 MB of `1,1,1,...` is 100,000 values, and validating them builds
one error object each (issue 56: a 21.6 MB answer, +400 MB). So a body is scanned first, in a way whose
cost is bounded whatever its bytes (one regular-expression pass over its strings and structural characters,
stopped at the first problem or after a few per allowed value; no copy of the body), and refused when it holds

    more than max_json_items(cfg)    values in one array or object (default 256: 4 x --max-texts, at least 256): 413
    more than max_json_values(cfg)   values in all (default 3,072: 8 x the above + 1,024): 413
    more than MAX_DEPTH               levels of nesting (32; the deepest valid request has 4): 422

before json.loads or pydantic see it. Every valid request fits: --max-texts texts (or pairs), at most
max_messages(cfg) chat messages of a few fields each, a handful of options. A body of a client that has
already left is dropped without being scanned or parsed (a cancel storm costs the bytes it sends, nothing
more), and a large body is scanned in a worker thread, so the event loop keeps answering meanwhile.

JsonBudget is the ASGI middleware (inside BodyLimit: the bytes it reads are already bounded); scan() is the
scan alone.
"""
from __future__ import annotations

import asyncio
import re

import anyio

from adalayers.serve.limits import MAX_DEPTH
from adalayers.serve.shapes import error_body_for

INLINE_SCAN_BYTES = 64 * 1024  # a larger body is scanned in a worker thread, off the event loop
# a JSON string (quotes included, written as one "unrolled" loop: no backtracking, C speed), or structure
_TOKEN = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{},]', re.DOTALL)  # a string, or structure
_OPEN, _CLOSE, _COMMA = b"[{", b"]}", ord(",")


def max_json_items(cfg) -> int:
    """Values one JSON array or object of a request may hold: 4 x --max-texts, at least 256 (chat messages,
    task names, texts or [text, second] pairs all fit)."""
    return max(256, 4 * cfg.max_texts)


def max_json_values(cfg) -> int:
    """Values (containers, strings, numbers, literals) a whole request body may hold."""
    return 8 * max_json_items(cfg) + 1024


def max_messages(cfg) -> int:
    """Chat messages one /v1/chat/completions request may hold (checked before templating)."""
    return max_json_items(cfg)


def max_conversation_chars(cfg) -> int:
    """Characters of all of a conversation's messages together: 4 x --max-chars (one message: --max-chars)."""
    return 4 * cfg.max_chars


def scan(body: bytes, max_items: int, max_values: int, max_depth: int = MAX_DEPTH) -> str | None:
    """Why `body` is refused before parsing (nested too deep, an array or object too wide, too many values in
    all), or None. One pass over its strings and structural characters (one regular-expression match each, the
    GIL free between two), stopped at the first problem or after 5 x max_values + 5 of them: a string is a value
    or a key, a comma follows a value, a container has two brackets, so more of them means more values. Not a
    JSON validator: a malformed body passes here and json.loads names its problem."""
    counts, values = [], 1  # per open container: commas so far; values: commas + containers + 1
    for n, m in enumerate(_TOKEN.finditer(body)):
        if n > 5 * max_values + 5:
            return f"holds more than {max_values} JSON values; the limit is {max_values} per request"
        c = body[m.start()]
        if c in _OPEN:
            counts.append(0)
            values += 1
            if len(counts) > max_depth:
                return f"is nested more than {max_depth} levels deep"
        elif c == _COMMA:
            values += 1
            if counts:
                counts[-1] += 1
                if counts[-1] >= max_items:
                    return f"has an array or object of more than {max_items} values; the limit is {max_items}"
        elif c in _CLOSE and counts:
            counts.pop()
    if values > max_values:
        return f"holds {values} JSON values; the limit is {max_values} per request"
    return None


class JsonBudget:
    """ASGI middleware: a JSON request body is read whole (BodyLimit, outside it, bounds its bytes), dropped
    if its client has left, scanned (scan(); off the event loop when large) and refused with 413 when over
    budget, else passed on to the app unchanged."""

    def __init__(self, app, max_items: int, max_values: int, max_depth: int = MAX_DEPTH, counters=None):
        """`counters`: the batcher; a body dropped because its client left counts in its `gone` and `dropped`."""
        self.app, self.max_items, self.max_values, self.max_depth = app, max_items, max_values, max_depth
        self.counters = counters

    def _dropped(self) -> None:
        if self.counters is not None:  # never queued, never run: counted as the handler counts such a request
            self.counters.gone += 1
            self.counters.dropped += 1

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        chunks, more = [], True
        while more:
            message = await receive()
            if message["type"] != "http.request":  # the client left while sending
                return self._dropped()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        del chunks
        if await _gone(receive):
            return self._dropped()  # nobody to answer: no parsing, no validation, no queue
        if body:
            if len(body) > INLINE_SCAN_BYTES:
                problem = await asyncio.to_thread(scan, body, self.max_items, self.max_values, self.max_depth)
            else:
                problem = scan(body, self.max_items, self.max_values, self.max_depth)
            if problem:
                status = 422 if "nested" in problem else 413  # deep: as FiniteRequest answers it
                return await _answer(send, status, f"the request body {problem}", scope["path"])
        await self.app(scope, _replay(body, receive), send)


async def _gone(receive) -> bool:
    """Has the client disconnected? Looks at the next message without waiting (Starlette's is_disconnected)."""
    await asyncio.sleep(0)  # one turn of the loop: a hang-up that arrived with the body's last bytes is seen
    message = {}
    with anyio.CancelScope() as scope:
        scope.cancel()
        message = await receive()
    return message.get("type") == "http.disconnect"


def _replay(body: bytes, receive):
    """A receive() that gives the app the body already read, in one message, then the real receive()'s."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return replayed


async def _answer(send, status: int, detail: str, path: str) -> None:
    body = error_body_for(path, status, detail)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
