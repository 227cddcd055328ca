"""The two shapes of an error body, and the one a layer before the routes answers in.

    {"detail": message}                                        adalayers' own routes (native)
    {"error": {"message", "type", "param", "code"}}            the /v1 routes (OpenAI's)

The routers choose theirs (serve/errors.py: the app's exception handlers, the /v1 route class); the
middlewares that answer before any route (the API key, the body and JSON limits) choose by path
(error_body_for).
"""
from __future__ import annotations

import json

OPENAI_PREFIX = "/v1/"
MAX_DETAIL_CHARS = 2000    # characters of an error message (one naming many unknown task names, say)


def clip(text: str, limit: int = MAX_DETAIL_CHARS) -> str:
    """`text` cut to `limit` characters, saying how many were left out."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text) - limit} more characters)"


def error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error shape."""
    kind = "server_error" if status >= 500 else "authentication_error" if status == 401 else "invalid_request_error"
    return {"error": {"message": clip(message), "type": kind, "param": param, "code": code}}


def error_body_for(path: str, status: int, message: str, code: str | None = None) -> bytes:
    """The JSON error body a layer before the routes answers on `path`: OpenAI's shape under /v1/, else native."""
    if path.startswith(OPENAI_PREFIX):
        return json.dumps(error_body(status, message, None, code)).encode()
    return json.dumps({"detail": message}).encode()
