"""The errors a request can get, typed, and the two shapes they are answered in.

Checks (serve/validate.py), the generation service (serve/generation.py) and the routers raise a
RequestError subclass; it knows its status, its message and, for OpenAI's shape, the field at fault:

    TooLarge       413  more texts, characters or tokens than the server's limits
    BadText        422  a text the rules refuse (textcheck.text_problem), or input that cannot be read
    Empty          422  on adalayers' routes, 400 on /v1 (OpenAI's invalid_request_error): nothing to run
    UnknownTask    400  a task name no loaded head has
    BadRequest     400  anything else the request asks that the server cannot do
    QueueFull      503  --max-queue requests pending (Retry-After)
    Expired        503  not answered within --request-timeout (Retry-After)
    ClientGone     499  the client left (never sent)
    ServerError    500  the server failed on a request it had accepted

Each router picks the shape: adalayers' own routes answer {"detail": message} (native, the app's exception
handler), the /v1 routes OpenAI's {"error": {"message", "type", "param", "code"}} (openai_body, their route
class). Layers that answer before any route (the API key, body and JSON limits, 404/405) choose by path:
error_body_for(path, ...).
"""
from __future__ import annotations

from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException

from adalayers.errors import AdaLayersError
from adalayers.serve.limits import MAX_ERRORS, json_safe, shallow
from adalayers.serve.shapes import OPENAI_PREFIX, clip, error_body


class RequestError(AdaLayersError):
    """A request the server answers with `status` and one line naming the problem."""
    status = 400
    openai_status: int | None = None  # the status on the /v1 routes, when it is not `status`

    def __init__(self, message: str, param: str | None = None, code: str | None = None,
                 headers: dict | None = None):
        super().__init__(message)
        self.message, self.param, self.code, self.headers = message, param, code, headers


class BadRequest(RequestError):
    status = 400


class UnknownTask(RequestError):
    status = 400


class Empty(RequestError):
    status, openai_status = 422, 400


class TooLarge(RequestError):
    status = 413


class BadText(RequestError):
    status = 422


class QueueFull(RequestError):
    status = 503


class Expired(RequestError):
    status = 503


class ClientGone(RequestError):
    status = 499


class ServerError(RequestError):
    status = 500


class OpenAIError(RequestError):
    """An error only the /v1 routes give, with its status and OpenAI's param and code."""

    def __init__(self, status: int, message: str, param: str | None = None, code: str | None = None,
                 headers: dict | None = None):
        super().__init__(message, param, code, headers)
        self.status = status

    def body(self) -> dict:
        return error_body(self.status, self.message, self.param, self.code)


def status_of(error: RequestError, openai: bool) -> int:
    return error.openai_status if openai and error.openai_status is not None else error.status


def openai_body(error: RequestError) -> dict:
    return error_body(status_of(error, True), error.message, error.param, error.code)


def add_error_handlers(app) -> None:
    """Native answers: a RequestError as {"detail": message}; 4xx answers that can always be sent, of a few KB
    at most: a validation error lists its first MAX_ERRORS problems (and how many there were), each echoing its
    input cut to a few levels, items and characters (shallow) and JSON-safe (json_safe), and an HTTPException's
    detail (which may quote a task name with a lone surrogate) is made JSON-safe, so no client input turns a 4xx
    into a 500. An HTTPException before any route (404, 405) on a /v1 path is answered in OpenAI's shape."""

    @app.exception_handler(RequestError)
    async def request_error(_request, exc: RequestError):
        return JSONResponse(status_code=exc.status, content={"detail": json_safe(clip(exc.message))},
                            headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(_request, exc: RequestValidationError):
        found = exc.errors()
        errors = [{k: shallow(v) if k in ("input", "ctx") else v for k, v in e.items()} for e in found[:MAX_ERRORS]]
        content = {"detail": json_safe(jsonable_encoder(errors))}
        if len(found) > MAX_ERRORS:
            content["errors"] = len(found)  # the first MAX_ERRORS are listed
        return JSONResponse(status_code=422, content=content)

    @app.exception_handler(HTTPException)
    async def http_error(request, exc: HTTPException):
        if request.url.path.startswith(OPENAI_PREFIX):
            return _openai_response(exc.status_code, error_body(exc.status_code, str(exc.detail)), exc.headers)
        detail = clip(exc.detail) if isinstance(exc.detail, str) else exc.detail
        return JSONResponse(status_code=exc.status_code, content={"detail": json_safe(detail)},
                            headers=exc.headers)


class OpenAIRoute(APIRoute):
    """The route class of the /v1 routers: every error of a route (a RequestError, a validation error, an
    HTTPException) answered in OpenAI's shape, {"error": {"message", "type", "param", "code"}}."""

    def get_route_handler(self):
        handler = super().get_route_handler()

        async def shaped(request):
            try:
                return await handler(request)
            except RequestError as e:
                return _openai_response(status_of(e, True), openai_body(e), e.headers)
            except RequestValidationError as e:
                return _openai_response(422, validation_body(e.errors()))
            except HTTPException as e:
                return _openai_response(e.status_code, error_body(e.status_code, str(e.detail)), e.headers)
        return shaped


def validation_body(errors: list[dict]) -> dict:
    """pydantic's first problem in OpenAI's shape: its field as param (none for a body that is not JSON)."""
    first = errors[0] if errors else {}
    loc = [str(x) for x in first.get("loc", [])[1:]]
    param = None if first.get("type") == "json_invalid" else ".".join(loc) or None  # loc: a position
    return error_body(422, f"{param + ': ' if param else ''}{first.get('msg', 'invalid value')}", param)


def _openai_response(status: int, body: dict, headers: dict | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content=json_safe(body), headers=headers)
