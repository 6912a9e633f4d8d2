"""One JSON error shape for every failure the API reports, and the handlers that produce it.

``{"error": {"code": ..., "message": ..., "field": ...}}``: FastAPI's validation errors, routing's
404/405, the body limit's 413, the client library's InvalidEnqueue and the API's own refusals all
come out this way.
"""

from __future__ import annotations

from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from evsched.errors import InvalidEnqueue, InvalidTask

log = structlog.get_logger("evsched.api")

# Codes for statuses raised by routing and middleware rather than by our handlers.
_STATUS_CODES = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


class FieldProblem(BaseModel):
    field: str | None
    message: str


class ErrorDetail(BaseModel):
    code: str = Field(description="Stable snake_case, e.g. validation_error, not_found.")
    message: str
    field: str | None = Field(description="The field at fault, null when none is.")
    details: list[FieldProblem] | None = Field(None, description="Every problem (422 only).")


class ErrorBody(BaseModel):
    """Every error response has this body."""

    error: ErrorDetail


class ApiError(Exception):
    """A refusal with its status, a stable snake_case code, and the field at fault if any."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        field: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.field = field
        self.headers = headers


class BodyTooLarge(StarletteHTTPException):
    """Raised while reading a body past the limit; FastAPI lets HTTPExceptions through."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body above the limit of {limit} bytes")


def error_response(
    status: int,
    code: str,
    message: str,
    *,
    field: str | None = None,
    details: list[FieldProblem] | None = None,
    headers: dict[str, str] | None = None,
) -> JSONResponse:
    body = ErrorBody(error=ErrorDetail(code=code, message=message, field=field, details=details))
    # ``field`` is always there (null when no one field is at fault); ``details`` only when set.
    return JSONResponse(
        body.model_dump(exclude={"error": {"details"}} if details is None else None),
        status_code=status,
        headers=headers,
    )


def _field_name(loc: tuple[Any, ...] | list[Any]) -> str | None:
    """``("body", "args", 0)`` → ``args.0``: where the problem is, without its location kind."""
    parts = [str(p) for p in loc]
    if parts and parts[0] in {"body", "query", "path", "header", "cookie"}:
        parts = parts[1:]
    return ".".join(parts) or None


def _problem(error: dict[str, Any]) -> FieldProblem:
    # A JSON syntax error's location is a character position, not a field.
    syntax = error.get("type") == "json_invalid"
    field = None if syntax else _field_name(error.get("loc", ()))
    return FieldProblem(field=field, message=str(error.get("msg", "")))


async def _validation(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    problems = [_problem(error) for error in exc.errors()]
    first = problems[0] if problems else FieldProblem(field=None, message="invalid request")
    return error_response(
        422, "validation_error", first.message, field=first.field, details=problems
    )


async def _http(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    code = _STATUS_CODES.get(exc.status_code, "http_error")
    message = exc.detail if isinstance(exc.detail, str) else code.replace("_", " ")
    headers = dict(exc.headers) if exc.headers else None
    if exc.status_code == 405:
        headers = {**(headers or {}), "Allow": ", ".join(_allowed(request))}
    return error_response(exc.status_code, code, message, headers=headers)


_METHODS = ("DELETE", "GET", "PATCH", "POST", "PUT")


def _allowed(request: Request) -> list[str]:
    """Every method some route serves at this path: routing names only the first route's."""
    return [
        method
        for method in _METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] is Match.FULL
            for route in request.app.routes
        )
    ]


async def _api(_: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.code, exc.message, field=exc.field, headers=exc.headers)


async def _invalid(_: Request, exc: Exception) -> JSONResponse:
    """The client library's own checks (sizes, delays, JSON args, cron...) refused the call."""
    assert isinstance(exc, InvalidEnqueue | InvalidTask)
    return error_response(422, "validation_error", exc.reason, field=exc.field)


async def _internal(request: Request, exc: Exception) -> JSONResponse:
    """A bug of ours: the same shape, no details leaked; the server still logs the traceback."""
    log.error("api_internal_error", path=request.url.path, error=repr(exc))
    return error_response(500, "internal_error", "internal error; see the API's log")


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _validation)
    app.add_exception_handler(StarletteHTTPException, _http)
    app.add_exception_handler(ApiError, _api)
    app.add_exception_handler(InvalidEnqueue, _invalid)
    app.add_exception_handler(InvalidTask, _invalid)
    app.add_exception_handler(Exception, _internal)


class BodyLimit:
    """Refuses request bodies above ``limit`` bytes with a 413, declared or streamed."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            response = error_response(
                413, "payload_too_large", f"request body above the limit of {self.limit} bytes"
            )
            await response(scope, receive, send)
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        await self.app(scope, counted, send)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None
