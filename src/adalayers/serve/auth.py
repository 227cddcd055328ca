"""Optional bearer-token authentication for `adalayers serve`.

With a key set (--api-key-file FILE, or the ADALAYERS_API_KEY environment variable), every
request except GET /health and the playground page's static files (GET /, /ui/*: no data, and the
page asks for the key itself) must carry one `Authorization: Bearer KEY` header; any other request
(two Authorization headers included) is answered 401 before it is read; one whose headers are over
serve/limits.py's bound is left to BodyLimit (431, as for any request). A key has at least
MIN_KEY_CHARS characters; a blank $ADALAYERS_API_KEY is refused, not taken as "no key". Keys are
compared in constant time (hmac.compare_digest over the UTF-8
bytes), so the answer's timing does not reveal how much of a guess was right.
"""
from __future__ import annotations

import hmac
import os
from pathlib import Path

from adalayers.errors import ConfigError
from adalayers.serve.limits import framing_problem
from adalayers.serve.shapes import error_body_for

ENV = "ADALAYERS_API_KEY"
OPEN_PATHS = {"/health", "/"}  # liveness probes need no key; nor does the playground page (routers/ui.py)
OPEN_PREFIXES = ("/ui/",)     # the page's script, style sheet and icon
MIN_KEY_CHARS = 16            # a shorter key is guessable; `python -c "import secrets; print(secrets.token_urlsafe(24))"`


def read_api_key(path: str | None) -> str | None:
    """The key from `path` (surrounding whitespace dropped), else from $ADALAYERS_API_KEY, else None."""
    if path:
        try:
            key = Path(path).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"--api-key-file {path}: cannot read it ({e.__class__.__name__}: {e})") from None
        if not key:
            raise ConfigError(f"--api-key-file {path}: the file is empty")
    else:
        if ENV not in os.environ:
            return None
        key = os.environ[ENV].strip()
        if not key:  # set but blank: serving without a key was not what was meant
            raise ConfigError(f"${ENV} is set but blank; set it to a key, or unset it to serve without one")
    if any(c.isspace() for c in key) or not key.isprintable():
        raise ConfigError("the API key must be one printable word without spaces")
    if len(key) < MIN_KEY_CHARS:
        raise ConfigError(f"the API key has {len(key)} characters; use at least {MIN_KEY_CHARS} (e.g. python -c "
                          f"\"import secrets; print(secrets.token_urlsafe(24))\")")
    return key


class BearerAuth:
    """ASGI middleware: 401 unless the request carries the key (paths in OPEN_PATHS excepted)."""

    def __init__(self, app, key: str):
        self.app, self.expected = app, f"Bearer {key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or scope["path"].startswith(OPEN_PREFIXES):
            return await self.app(scope, receive, send)
        if framing_problem(scope):  # oversized headers (a 17 KB Authorization too): BodyLimit's 431 or 400
            return await self.app(scope, receive, send)
        given = [v for k, v in scope["headers"] if k == b"authorization"]
        # exactly one Authorization header, and the right one: a second header never rescues a first wrong one
        if len(given) == 1 and hmac.compare_digest(given[0], self.expected):
            return await self.app(scope, receive, send)
        body = error_body_for(scope["path"], 401, "missing or wrong API key: send 'Authorization: Bearer KEY'",
                              "invalid_api_key")
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
