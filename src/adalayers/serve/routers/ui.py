"""The playground page: GET / (on by default; `adalayers serve --no-ui` leaves it out).

    GET /            static/index.html: the loaded heads, a text box answered by /predict, and on a
                     decoder base a prompt streamed from /generate/stream (static/app.js)
    GET /ui/{file}   its script, style sheet and icon (package data under adalayers/serve/static)

The page is static and self-contained: no CDN, no web fonts, no build step; every call it makes goes
to this service (a Content-Security-Policy of 'self' says so to the browser as well). It holds no
data of its own, so it is served without the API key (auth.OPEN_PATHS); the page asks for the key
once and sends it as the bearer token of its API calls.
"""
from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from fastapi import FastAPI
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles

from adalayers.serve.state import ServeState

STATIC = Path(str(files("adalayers.serve") / "static"))
# everything from this origin only; no inline script or style (the page sets styles through the CSSOM)
CSP = ("default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'none'")
HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Cache-Control": "no-cache"}


class _Static(StaticFiles):
    """StaticFiles whose answers carry the page's security headers."""

    def file_response(self, *args, **kwargs):
        response = super().file_response(*args, **kwargs)
        response.headers.update(HEADERS)
        return response


def add_routes(app: FastAPI, state: ServeState) -> None:
    """GET / (the page) and /ui/* (its files), unless ServeConfig.ui is off (--no-ui)."""
    if not state.cfg.ui:
        return
    index = STATIC / "index.html"

    @app.api_route("/", methods=["GET", "HEAD"], include_in_schema=False)  # HEAD: monitors' checks
    async def page() -> FileResponse:
        return FileResponse(index, media_type="text/html; charset=utf-8", headers=HEADERS)

    app.mount("/ui", _Static(directory=STATIC), name="ui")
