"""Bounds on what one client can make the server read: body size and read time.

BodyLimit (ASGI middleware): a body is refused with 413 as soon as it is known to be too large:
at once when its Content-Length says so, otherwise while it is being read, counting the bytes
of every chunk (Transfer-Encoding: chunked has no Content-Length). At most `max_bytes` + one
chunk is ever held, whatever the transfer encoding.

timed_h11(read_timeout): uvicorn's h11 protocol with a read deadline. uvicorn closes idle
keep-alive connections (timeout_keep_alive) but waits forever for a request whose headers
arrive one byte at a time, or whose body never arrives: every byte resets its keep-alive timer.
Here a request must be received whole (headers and body) within `read_timeout` seconds of
the connection opening or of the previous answer; past it the client gets 408 and the
connection is closed. Once a request has arrived whole the deadline no longer applies
(the server-side request deadline is the app's).
"""
from __future__ import annotations

import json
import math

import h11
from pydantic import BaseModel, ConfigDict, model_validator
from uvicorn.protocols.http.h11_impl import H11Protocol


class BodyTooLarge(Exception):
    """Raised into the app from receive() when the body passes the limit."""


class BodyLimit:
    def __init__(self, app, max_bytes: int, hint: str = ""):
        self.app, self.max_bytes, self.hint = app, max_bytes, hint

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        size = dict(scope["headers"]).get(b"content-length", b"")
        if size.isdigit() and int(size) > self.max_bytes:
            return await self._refuse(send, f"request body has {int(size)} bytes")
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
            await self._refuse(send, f"request body passed {self.max_bytes} bytes while being read")

    async def _refuse(self, send, what: str) -> None:
        body = json.dumps({"detail": f"{what}; the limit is {self.max_bytes} bytes{self.hint}"}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"connection", b"close"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


def timed_h11(read_timeout: float) -> type[H11Protocol]:
    """An H11Protocol class whose requests must arrive whole within `read_timeout` seconds."""

    class TimedH11Protocol(H11Protocol):
        _read_timer = None

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


def has_non_finite(value) -> bool:
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, dict):
        return any(has_non_finite(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(has_non_finite(v) for v in value)
    return False


class FiniteRequest(BaseModel):
    """A request body: unknown fields refused, and any non-finite number in it (JSON NaN, Infinity,
    an overflowing 1e999) a 422 before the fields are read."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _finite_numbers(cls, data):
        if has_non_finite(data):
            raise ValueError("the request holds a non-finite number (NaN or Infinity); JSON numbers must be finite")
        return data


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
