"""One error hierarchy for the whole service, mapped to HTTP in one place.

Every error body has the shape ``{"error_code": str, "message": str}``; ``message`` says what
to fix. Store and API code raise :class:`ServiceError` subclasses; :func:`install_handlers`
turns them, request-validation errors and database outages into responses.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable
from typing import Any

import psycopg
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from curvecast.contract import (
    KEY_CHARS,
    KEY_MAX_LENGTH,
    KEY_PATTERN,
    PROJECT_CHARS,
    PROJECT_MAX_LENGTH,
    PROJECT_PATTERN,
)
from curvecast.service.schemas import PRINTABLE_PATTERN, PROJECT_FILTER_PATTERN, ErrorOut

log = logging.getLogger(__name__)

#: The one table from error codes to HTTP statuses.
ERROR_CODE_TO_HTTP_STATUS: dict[str, int] = {
    "malformed_json": 400,
    "host_not_allowed": 400,
    "invalid_request": 422,
    "unauthenticated": 401,
    "forbidden": 403,
    "not_found": 404,
    "run_not_found": 404,
    "method_not_allowed": 405,
    "conflict": 409,
    "payload_too_large": 413,
    "too_many_points": 413,
    "headers_too_large": 431,
    "read_too_large": 422,
    "too_many_keys": 422,
    "webhook_target_not_allowed": 422,
    "unavailable": 503,
    "schema_out_of_date": 503,
    "internal_error": 500,
}


#: The error answers every API route may give, documented in its OpenAPI operation so that
#: every response conforms to the published schema (and FastAPI's own ``{"detail": ...}`` 422
#: shape, which this service never sends, is not advertised).
ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {"model": ErrorOut, "description": "The body is not valid JSON (`malformed_json`)."},
    401: {"model": ErrorOut, "description": "No valid token (`unauthenticated`)."},
    403: {"model": ErrorOut, "description": "The token's scope does not allow this."},
    404: {"model": ErrorOut, "description": "Not found, or not visible to this token."},
    409: {"model": ErrorOut, "description": "Conflicts with what is stored."},
    413: {"model": ErrorOut, "description": "Body or batch over the configured limit."},
    422: {
        "model": ErrorOut,
        "description": "Invalid request; the message names the field (`invalid_request`), or a "
        "raw read over the configured size (`read_too_large`: downsample or export), a batch "
        "that would give a run more keys than allowed (`too_many_keys`), or a webhook URL "
        "whose host is a private address (`webhook_target_not_allowed`).",
    },
    503: {
        "model": ErrorOut,
        "description": "The database is unreachable; retry after `Retry-After` seconds.",
        "headers": {"Retry-After": {"schema": {"type": "integer"}}},
    },
}


class ServiceError(Exception):
    """Base of every error the service reports to clients."""

    error_code = "internal_error"

    def __init__(self, message: str, *, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.headers = headers or {}

    @property
    def status_code(self) -> int:
        """HTTP status from the one table."""
        return ERROR_CODE_TO_HTTP_STATUS[self.error_code]


class InvalidInput(ServiceError):
    """The request is well-formed JSON but asks for something invalid."""

    error_code = "invalid_request"


class ReadTooLarge(InvalidInput):
    """A raw read would return more points than one response may (downsample, narrow, or
    export the CSV, which streams)."""

    error_code = "read_too_large"


class TooManyKeys(InvalidInput):
    """A batch would give a run more distinct keys than ``CURVECAST_MAX_KEYS_PER_RUN``."""

    error_code = "too_many_keys"


class WebhookTargetNotAllowed(InvalidInput):
    """A webhook URL names a private, loopback, link-local or reserved address."""

    error_code = "webhook_target_not_allowed"


class NotFound(ServiceError):
    """The resource does not exist (or is not visible to this token)."""

    error_code = "not_found"


class RunNotFound(NotFound):
    """The run does not exist (or belongs to another project)."""

    error_code = "run_not_found"


class Conflict(ServiceError):
    """The request conflicts with what is stored."""

    error_code = "conflict"


class Unauthenticated(ServiceError):
    """No valid token was presented."""

    error_code = "unauthenticated"

    def __init__(self, message: str) -> None:
        super().__init__(message, headers={"WWW-Authenticate": "Bearer"})


class Forbidden(ServiceError):
    """The token is valid but its scope does not allow this."""

    error_code = "forbidden"


class PayloadTooLarge(ServiceError):
    """The body or the batch is larger than the configured limit."""

    error_code = "payload_too_large"


class TooManyPoints(PayloadTooLarge):
    """A metric batch carries more points than one request may."""

    error_code = "too_many_points"


class Unavailable(ServiceError):
    """A dependency (the database) is unreachable; the client should retry later."""

    error_code = "unavailable"


class SchemaOutOfDate(ServiceError):
    """The database schema is older than this code; run ``curvecast migrate``."""

    error_code = "schema_out_of_date"


def error_response(
    error_code: str, message: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    """Build the standard error body for ``error_code``."""
    return JSONResponse(
        status_code=ERROR_CODE_TO_HTTP_STATUS[error_code],
        content={"error_code": error_code, "message": message},
        headers=headers,
    )


def format_location(loc: tuple[int | str, ...]) -> str:
    """Render a pydantic error location as ``values.loss[17]`` (dropping the leading "body")."""
    parts = list(loc)
    if parts and parts[0] in {"body", "query", "path", "header"}:
        parts = parts[1:]
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "body"


def _chars(chars: str) -> str:
    """A character class in words: ``A-Za-z0-9_.-`` -> ``A-Z a-z 0-9 _ . -``."""
    rest = chars.removeprefix("A-Za-z0-9")
    return "A-Z a-z 0-9 " + " ".join(rest) if rest != chars else chars


_PROJECT_WORDS = (f"a project name is 1-{PROJECT_MAX_LENGTH} characters from "
                  f"{_chars(PROJECT_CHARS)}")
#: What the names' patterns ask for, in words: a pattern's own message quotes the regular
#: expression ("String should match pattern '^[A-Za-z0-9_.-]{0,100}$'").
_PATTERN_WORDS = {
    KEY_PATTERN: f"a metric name is 1-{KEY_MAX_LENGTH} characters from {_chars(KEY_CHARS)} "
                 "(e.g. 'loss' or 'eval/loss')",
    PROJECT_PATTERN: _PROJECT_WORDS,
    PROJECT_FILTER_PATTERN: _PROJECT_WORDS,  # a filter may be empty; a name may not
    PRINTABLE_PATTERN: "control characters (a newline, a tab, ...) are not allowed here",
}


def validation_message(errors: list[dict[str, Any]]) -> tuple[str, str]:
    """Summarise pydantic errors: the first few, each naming the field and index."""
    if any(e.get("type") == "json_invalid" for e in errors):
        detail = next(e for e in errors if e.get("type") == "json_invalid")
        ctx = detail.get("ctx", {})
        return (
            "malformed_json",
            f"request body is not valid JSON: {ctx.get('error', 'parse error')}",
        )
    parts = []
    for err in errors[:5]:
        loc = tuple(err.get("loc", ()))
        msg = str(err.get("msg", "invalid")).removeprefix("Value error, ")
        words = _PATTERN_WORDS.get(str((err.get("ctx") or {}).get("pattern")))
        if err.get("type") == "string_pattern_mismatch" and words is not None:
            # A dict key is named below already; another value is named here.
            named = "" if loc and loc[-1] == "[key]" else f"{err.get('input')!r} is "
            msg = f"{named}not valid: {words}"
        if loc and loc[-1] == "[key]":
            # A dict key failed (e.g. a metric name): name the key itself.
            where, msg = format_location(loc[:-2]), f"key {loc[-2]!r}: {msg}"
        else:
            where = format_location(loc)
        # Model-level checks already name their fields in the message.
        model_level = where == "body" and err.get("type") == "value_error"
        parts.append(msg if model_level else f"{where}: {msg}")
    if len(errors) > 5:
        parts.append(f"... and {len(errors) - 5} more errors")
    return "invalid_request", "; ".join(parts)


def _allowed_methods(request: Request) -> str:
    """Every method some route serves at this path, for the ``Allow`` header of a 405.

    Starlette names only the first route that matched the path, so a path served by several
    routes (``PUT``/``GET``/``PATCH /api/v1/runs/{id}``) would advertise one method of three.
    """
    routes = request.app.router.routes
    return ", ".join(
        method
        for method in ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE")
        if any(r.matches({**request.scope, "method": method})[0] == Match.FULL for r in routes)
    )


def install_handlers(app: FastAPI, retry_after_s: int,
                     page_not_found: Callable[[Request], Response | None] | None = None
                     ) -> None:
    """Register the handlers that turn every failure into the standard error body.

    ``page_not_found`` answers an unknown address first, when it returns a response: the
    pages' HTML 404 for a page address a browser opened (API paths keep the JSON body).
    """

    @app.exception_handler(ServiceError)
    async def _service_error(_request: Request, exc: ServiceError) -> JSONResponse:
        headers = dict(exc.headers)
        if exc.status_code == 503:
            headers.setdefault("Retry-After", str(retry_after_s))
        return error_response(exc.error_code, exc.message, headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        code, message = validation_message(list(exc.errors()))
        return error_response(code, message)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException) -> Response:
        if exc.status_code == 404 and page_not_found is not None:
            page = page_not_found(request)
            if page is not None:
                return page
        code = {404: "not_found", 405: "method_not_allowed", 413: "payload_too_large"}.get(
            exc.status_code, "invalid_request" if exc.status_code < 500 else "internal_error"
        )
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = _allowed_methods(request)
        response = error_response(code, str(exc.detail), headers)
        response.status_code = exc.status_code
        return response

    @app.exception_handler(OperationalError)
    @app.exception_handler(PoolTimeoutError)
    # The same errors raised by the drivers themselves, where a store statement runs on the
    # DB-API cursor (ingest): a deadlock or serialisation failure PostgreSQL aborted, a lost
    # connection, SQLite's "database is locked".
    @app.exception_handler(psycopg.OperationalError)
    @app.exception_handler(sqlite3.OperationalError)
    async def _db_unavailable(_request: Request, exc: Exception) -> JSONResponse:
        # Connection refused, server shutting down, pool exhausted, a transaction the database
        # aborted to break a deadlock: all mean "try again soon".
        log.warning("database unavailable: %s", str(exc).splitlines()[0])
        return error_response(
            "unavailable",
            "the database is unreachable right now; retry after the Retry-After delay",
            {"Retry-After": str(retry_after_s)},
        )

    @app.exception_handler(DBAPIError)
    async def _db_error(_request: Request, exc: DBAPIError) -> JSONResponse:
        if exc.connection_invalidated:
            return error_response(
                "unavailable",
                "the database connection was lost; retry after the Retry-After delay",
                {"Retry-After": str(retry_after_s)},
            )
        log.exception("database error")
        return error_response("internal_error", "internal database error")

    @app.exception_handler(json.JSONDecodeError)
    async def _json_error(_request: Request, exc: json.JSONDecodeError) -> JSONResponse:
        return error_response("malformed_json", f"request body is not valid JSON: {exc}")
