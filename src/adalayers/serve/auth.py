"""Optional bearer-token authentication for `adalayers serve`.

With a key set (--api-key-file FILE, or the ADALAYERS_API_KEY environment variable), every
request except GET /health and the playground page's static files (GET /, /ui/*: no data, and the
page asks for the key itself) must carry `Authorization: Bearer KEY`; any other request is answered
401 before it is read. Keys are compared in constant time (hmac.compare_digest over the UTF-8
bytes), so the answer's timing does not reveal how much of a guess was right.
"""
from __future__ import annotations

import hmac
import json
import os
from pathlib import Path

from adalayers.errors import ConfigError

ENV = "ADALAYERS_API_KEY"
OPEN_PATHS = {"/health", "/"}  # liveness probes need no key; nor does the playground page (routers/ui.py)
OPEN_PREFIXES = ("/ui/",)     # the page's script, style sheet and icon


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
        key = os.environ.get(ENV, "").strip()
        if not key:
            return None
    if any(c.isspace() for c in key) or not key.isprintable():
        raise ConfigError("the API key must be one printable word without spaces")
    return key


class BearerAuth:
    """ASGI middleware: 401 unless the request carries the key (paths in OPEN_PATHS excepted)."""

    def __init__(self, app, key: str):
        self.app, self.expected = app, f"Bearer {key}".encode()

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] in OPEN_PATHS or scope["path"].startswith(OPEN_PREFIXES):
            return await self.app(scope, receive, send)
        given = dict(scope["headers"]).get(b"authorization", b"")
        if hmac.compare_digest(given, self.expected):
            return await self.app(scope, receive, send)
        body = json.dumps({"detail": "missing or wrong API key: send 'Authorization: Bearer KEY'"}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
