"""Bounds on what one client can make the server read: body size and read time.

BodyLimit (ASGI middleware): a request line plus headers over MAX_HEADER_BYTES is refused with 431, one
with both Content-Length and Transfer-Encoding with 400 (both close the connection), before anything else.
A body is refused with 413 as soon as it is known to be too large:
at once when its Content-Length says so, otherwise while it is being read, counting the bytes
of every chunk (Transfer-Encoding: chunked has no Content-Length). At most `max_bytes` + one
chunk is ever held, whatever the transfer encoding.

timed_h11(read_timeout): uvicorn's h11 protocol with a read deadline. uvicorn closes idle
keep-alive connections (timeout_keep_alive) but waits forever for a request whose headers
arrive one byte at a time, or whose body never arrives: every byte resets its keep-alive timer.
Here a request must be received whole (headers and body) within `read_timeout` seconds of
the connection opening or of the previous answer; past it the client gets 408 and the
connection is closed. Once a request has arrived whole the deadline no longer applies
(the server-side request deadline is the app's). A request h11 cannot read (headers still arriving past
16 KiB: 431, as BodyLimit's; anything malformed: 400) is answered, then closed lingering: what the client
still sends is dropped until it closes, so that no TCP reset overtakes the answer.
"""
from __future__ import annotations

import asyncio
import json
import math

import h11
from pydantic import BaseModel, ConfigDict, model_validator
from uvicorn.protocols.http.h11_impl import H11Protocol

from adalayers.jsoncheck import json_problem
from adalayers.serve.shapes import clip, error_body_for


class BodyTooLarge(Exception):
    """Raised into the app from receive() when the body passes the limit."""


MAX_HEADER_BYTES = 16 * 1024  # request line + headers
JSON_BYTES_PER_CHAR = 12      # the most JSON spends on one character: a non-BMP one as "\\ud83d\\ude00"


def max_body_bytes(cfg) -> int:
    """The largest body a valid request can have, in any JSON encoding: --max-texts texts and as many
    second texts (sentence pairs), each of --max-chars characters at JSON_BYTES_PER_CHAR bytes, with their
    quotes and commas, plus 4 KiB for the rest of the request. Characters and tokens are limited after
    parsing (--max-chars, --max-tokens); this byte limit only keeps larger bodies from being read."""
    return 2 * cfg.max_texts * (cfg.max_chars * JSON_BYTES_PER_CHAR + 16) + 4096


def framing_problem(scope, max_header_bytes: int = MAX_HEADER_BYTES) -> tuple[int, str] | None:
    """(status, why) for a request whose head is refused: headers over `max_header_bytes` (431), or both
    Content-Length and Transfer-Encoding, which RFC 9112 (6.1) says to refuse and close (400)."""
    size = len(scope.get("raw_path") or b"") + len(scope.get("query_string") or b"") + 16
    size += sum(len(k) + len(v) + 4 for k, v in scope["headers"])
    if size > max_header_bytes:
        return 431, f"the request line and headers have {size} bytes; the limit is {max_header_bytes}"
    names = {k for k, _ in scope["headers"]}
    if b"content-length" in names and b"transfer-encoding" in names:
        return 400, "the request has both Content-Length and Transfer-Encoding; send one"
    return None


class BodyLimit:
    def __init__(self, app, max_bytes: int, hint: str = ""):
        self.app, self.max_bytes, self.hint = app, max_bytes, hint

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        refused = framing_problem(scope)
        if refused:
            if refused[0] == 431:  # the head was read whole: read a body that fits too, so that closing the
                await _drain(receive, self.max_bytes)  # connection does not reset it before the answer is read
            return await _answer(send, *refused, scope["path"])
        size = dict(scope["headers"]).get(b"content-length", b"")
        if size.isdigit() and int(size) > self.max_bytes:
            return await self._refuse(send, f"request body has {int(size)} bytes", scope["path"])
        seen, over, started = 0, False, False

        async def counted_receive():
            nonlocal seen, over
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    over = True
                    raise BodyTooLarge()
            return message

        async def guarded_send(message):
            nonlocal started
            if over:
                return  # the app's own answer to the exception is replaced by the 413 below
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, guarded_send)
        except BodyTooLarge:
            pass
        if over and not started:
            await self._refuse(send, f"request body passed {self.max_bytes} bytes while being read", scope["path"])

    async def _refuse(self, send, what: str, path: str) -> None:
        await _answer(send, 413, f"{what}; the limit is {self.max_bytes} bytes{self.hint}", path)


async def _drain(receive, max_bytes: int, timeout_s: float = 1.0) -> None:
    """Read and drop the request's body, at most `max_bytes` and `timeout_s`: a client still sending when the
    server closes gets a TCP reset, which can arrive before it has read the answer."""
    seen = 0
    try:
        async with asyncio.timeout(timeout_s):
            while seen <= max_bytes:
                message = await receive()
                seen += len(message.get("body", b""))
                if message["type"] != "http.request" or not message.get("more_body"):
                    return
    except TimeoutError:
        return


async def _answer(send, status: int, detail: str, path: str) -> None:
    """A JSON error answer (in the shape of the path's router) that closes the connection (the request's body is
    never read)."""
    body = error_body_for(path, status, detail)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"connection", b"close"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


LINGER_S = 2.0  # how long a refused connection keeps reading (and dropping) what its client still sends


def _raw_answer(status: int, detail: str) -> bytes:
    """A whole HTTP/1.1 JSON error answer that closes the connection, as bytes for the transport."""
    body = json.dumps({"detail": detail}).encode()
    reason = {400: b"Bad Request", 431: b"Request Header Fields Too Large"}[status]
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: %d"
            b"\r\n\r\n" % (status, reason, len(body))) + body


def timed_h11(read_timeout: float) -> type[H11Protocol]:
    """An H11Protocol class whose requests must arrive whole within `read_timeout` seconds."""

    class TimedH11Protocol(H11Protocol):
        _read_timer = None
        _refused = False

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def connection_lost(self, exc) -> None:
            if self._read_timer is not None:
                self._read_timer.cancel()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if not self._refused:  # after a refusal the rest of the request is read and dropped
                super().data_received(data)

        def send_400_response(self, msg: str) -> None:
            """h11 could not read the request. A head still incomplete past h11's buffer (16 KiB) gets the 431
            a head parsed whole gets from BodyLimit; anything else uvicorn's 400. Then a lingering close: the
            answer and a FIN go out, what the client still sends is dropped, and the socket closes when the
            client does (or after LINGER_S). Closing at once with unread bytes resets the connection, and
            the reset can reach the client before the answer it has not read yet."""
            head = self.conn.trailing_data[0]
            if b"\r\n\r\n" not in head and len(head) > MAX_HEADER_BYTES:
                status, detail = 431, (f"the request line and headers passed {MAX_HEADER_BYTES} bytes before "
                                       f"they ended; the limit is {MAX_HEADER_BYTES}")
            else:
                status, detail = 400, msg
            self.logger.warning("refused a request h11 could not read (%s): %s", status, detail)
            self._refused = True
            self.transport.write(_raw_answer(status, detail))
            if self.transport.can_write_eof():
                self.transport.write_eof()
                self.loop.call_later(LINGER_S, self.transport.close)
            else:
                self.transport.close()

        def _arm(self) -> None:
            if self._read_timer is not None:
                self._read_timer.cancel()
            self._read_timer = self.loop.call_later(read_timeout, self._read_timeout)

        def _read_timeout(self) -> None:
            self._read_timer = None
            if self.transport.is_closing() or self.conn.their_state not in (h11.IDLE, h11.SEND_BODY):
                return  # the request has arrived whole (or the connection is done)
            if self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]:
                if self.cycle is None:  # a connection that never sent anything: closed silently
                    self.transport.close()
                return  # nothing of a next request has come: uvicorn's keep-alive timeout applies
            self.logger.warning("a client took over %s s to send its request; closing the connection", read_timeout)
            if self.cycle is None or self.cycle.response_complete or not self.cycle.response_started:
                body = f"request not received within {read_timeout:g} s (read timeout)".encode()
                self.transport.write(b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain\r\n"
                                     b"connection: close\r\ncontent-length: " + str(len(body)).encode()
                                     + b"\r\n\r\n" + body)
            self.transport.close()  # an app waiting for the body sees a disconnect

    return TimedH11Protocol


MAX_DEPTH = 32  # JSON nesting a request body may have (the deepest valid one: 4)


def body_problem(value, max_depth: int = MAX_DEPTH) -> str | None:
    """Why a parsed JSON body cannot be read further, or None (jsoncheck: too deep, or non-finite)."""
    problem = json_problem(value, max_depth)
    return f"the request {problem}" if problem else None


class FiniteRequest(BaseModel):
    """A request body: unknown fields refused, and any non-finite number in it (JSON NaN, Infinity,
    an overflowing 1e999) or nesting deeper than MAX_DEPTH a 422 before the fields are read."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _finite_numbers(cls, data):
        problem = body_problem(data)
        if problem:
            raise ValueError(problem)
        return data


MAX_ERRORS = 5             # validation problems an error answer lists (then how many there were in all)
MAX_ECHO_ITEMS = 5         # items of an array or object echoed in an error answer
MAX_ECHO_CHARS = 200       # characters of a string echoed in an error answer


def shallow(value, depth: int = 3):
    """`value` cut to `depth` levels (deeper containers become "..."), MAX_ECHO_ITEMS items per container
    (then "... N more") and MAX_ECHO_CHARS characters per string: for echoing a request's input in an error
    message without walking (or printing) all of a deep or wide body."""
    if isinstance(value, str):
        return clip(value, MAX_ECHO_CHARS)
    if isinstance(value, dict):
        if depth <= 0:
            return "..."
        out = {k: shallow(v, depth - 1) for k, v in list(value.items())[:MAX_ECHO_ITEMS]}
        return out | ({"...": f"{len(value) - MAX_ECHO_ITEMS} more"} if len(value) > MAX_ECHO_ITEMS else {})
    if isinstance(value, (list, tuple)):
        if depth <= 0:
            return "..."
        out = [shallow(v, depth - 1) for v in value[:MAX_ECHO_ITEMS]]
        return out + ([f"... {len(value) - MAX_ECHO_ITEMS} more"] if len(value) > MAX_ECHO_ITEMS else [])
    return value


def json_safe(value):
    """A copy of `value` that JSON can carry: NaN/Infinity floats become their names, strings with
    lone surrogates get them as \\udxxx escapes."""
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode("utf-8")
    if isinstance(value, dict):
        return {json_safe(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


async def client_gone(request) -> None:
    """Returns when the client disconnects (the body has been read: the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
