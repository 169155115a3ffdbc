"""The API's one error shape, ``{"error": {"code", "message", "details"?}}``, and its handlers.

Every way a request can fail ends here: an ``ApiError`` raised by a view, a domain error from
``app/`` (validation, not-found, conflict, transient storage), a Werkzeug HTTP error (404 for
an unknown route, 405, 413) or — as a last resort — an unexpected exception, which becomes a
500 in the same shape and is counted so tests can prove no malformed request reaches it.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from flask import Flask, Response, jsonify
from werkzeug.exceptions import HTTPException

from app.factory.service import ObjectiveNotFound
from app.jobs.errors import (
    ConflictError,
    JobArchived,
    JobNotFound,
    TooManyCommands,
    ValidationError,
)
from app.storage.db import is_storage_outage

log = logging.getLogger("receipt.api")

# Codes are part of the public contract (clients branch on them); each is spelled once here.
INVALID_JSON = "invalid_json"
INVALID_FIELD = "invalid_field"
UNAUTHORIZED = "unauthorized"
INVALID_TOKEN = "invalid_token"
FORBIDDEN = "forbidden"
NOT_FOUND = "not_found"
METHOD_NOT_ALLOWED = "method_not_allowed"
CONFLICT = "conflict"
PAYLOAD_TOO_LARGE = "payload_too_large"
NOT_READY = "not_ready"
UNAVAILABLE = "unavailable"
INTERNAL = "internal_error"
# An id whose job or objective the archiving pass moved out (410; details hold its tombstone summary).
ARCHIVED = "archived"
# A token without the scope an operation needs (details.scope names it).
MISSING_SCOPE = "missing_scope"
# A job that runs a command, on a deployment that runs none (details.setting names the switch).
COMMANDS_DISABLED = "commands_disabled"
# A job already holds RECEIPT_MAX_COMMANDS_PER_JOB queue commands.
TOO_MANY_COMMANDS = "too_many_commands"
# The organisation's write rate limit (429, Retry-After).
RATE_LIMITED = "rate_limited"
# Too many open event streams for this token or this process (429, Retry-After).
TOO_MANY_STREAMS = "too_many_streams"

ERROR_CODES = (
    INVALID_JSON,
    INVALID_FIELD,
    UNAUTHORIZED,
    INVALID_TOKEN,
    FORBIDDEN,
    NOT_FOUND,
    METHOD_NOT_ALLOWED,
    CONFLICT,
    PAYLOAD_TOO_LARGE,
    NOT_READY,
    UNAVAILABLE,
    INTERNAL,
    MISSING_SCOPE,
    COMMANDS_DISABLED,
    TOO_MANY_COMMANDS,
    RATE_LIMITED,
    TOO_MANY_STREAMS,
    ARCHIVED,
)

# One message for "no such job" and "another organisation's job": the two must be identical.
JOB_NOT_FOUND_MESSAGE = "no job with that id"


class ApiError(Exception):
    """An error the API answers with on purpose: its status, code, message and optional details."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        details: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.details = dict(details) if details is not None else None
        self.headers = dict(headers or {})


def invalid_json(message: str) -> ApiError:
    return ApiError(400, INVALID_JSON, f"request body is not valid JSON: {message}", {"field": "body"})


def job_not_found() -> ApiError:
    """The one 404 for a job: unknown and not-yours must be indistinguishable."""
    return ApiError(404, NOT_FOUND, JOB_NOT_FOUND_MESSAGE)


def archived(summary: Mapping[str, Any]) -> ApiError:
    """The 410 of an archived job or objective: its tombstone's summary, and where its history went."""
    what = "objective" if "title" in summary else "job"
    return ApiError(
        410,
        ARCHIVED,
        f"this {what} was archived: its receipts are in archive segment "
        f"{summary.get('archive', {}).get('segment')}; the id stays taken",
        summary,
    )


def stream_not_found() -> ApiError:
    return ApiError(404, NOT_FOUND, "no stream with that name")


def forbidden(message: str) -> ApiError:
    return ApiError(403, FORBIDDEN, message)


def error_response(
    status: int,
    code: str,
    message: str,
    details: Mapping[str, Any] | None = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    """Build the JSON error response every failure uses."""
    error: dict[str, Any] = {"code": code, "message": message}
    if details is not None:
        error["details"] = dict(details)
    response = jsonify({"error": error})
    response.status_code = status
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


_HTTP_CODES = {404: NOT_FOUND, 405: METHOD_NOT_ALLOWED, 413: PAYLOAD_TOO_LARGE, 400: INVALID_JSON}
_HTTP_MESSAGES = {404: "no such route", 405: "this route does not allow that method"}


def register_error_handlers(app: Flask, on_internal_error: Any) -> None:
    """Route every exception to the JSON error shape. ``on_internal_error()`` counts 500s."""

    @app.errorhandler(ApiError)
    def _api_error(exc: ApiError) -> Response:
        return error_response(exc.status, exc.code, exc.message, exc.details, exc.headers)

    @app.errorhandler(ValidationError)
    def _validation(exc: ValidationError) -> Response:
        return error_response(400, INVALID_FIELD, exc.message, exc.to_details())

    @app.errorhandler(JobNotFound)
    def _not_found(exc: JobNotFound) -> Response:
        return error_response(404, NOT_FOUND, JOB_NOT_FOUND_MESSAGE)

    @app.errorhandler(JobArchived)
    def _archived(exc: JobArchived) -> Response:
        err = archived(exc.summary)
        return error_response(err.status, err.code, err.message, err.details)

    @app.errorhandler(TooManyCommands)
    def _too_many_commands(exc: TooManyCommands) -> Response:
        return error_response(409, TOO_MANY_COMMANDS, str(exc))

    @app.errorhandler(ObjectiveNotFound)
    def _objective_not_found(exc: ObjectiveNotFound) -> Response:
        return error_response(404, NOT_FOUND, "no objective with that id")

    @app.errorhandler(ConflictError)
    def _conflict(exc: ConflictError) -> Response:
        return error_response(409, CONFLICT, str(exc))

    @app.errorhandler(HTTPException)
    def _http(exc: HTTPException) -> Response:
        status = exc.code or 500
        code = _HTTP_CODES.get(status, f"http_{status}")
        if status == 413:
            message = f"request body is larger than {app.config['MAX_CONTENT_LENGTH'] - 1} bytes"
        elif status in _HTTP_MESSAGES:
            message = _HTTP_MESSAGES[status]
        else:
            message = (exc.description or exc.name or "").strip()
        headers: dict[str, str] = {}
        if status == 405 and exc.get_response().headers.get("Allow"):
            headers["Allow"] = exc.get_response().headers["Allow"]
        return error_response(status, code, message, None, headers)

    @app.errorhandler(Exception)
    def _unexpected(exc: Exception) -> Response:
        if _is_storage_outage(exc):
            # The database is down or overloaded: a retryable 503, not a bug.
            log.warning("storage unavailable: %s", exc)
            return error_response(
                503, UNAVAILABLE, "storage is temporarily unavailable; retry", None, {"Retry-After": "1"}
            )
        on_internal_error()
        log.exception("unexpected error handling request")
        return error_response(500, INTERNAL, "internal server error")


def _is_storage_outage(exc: BaseException) -> bool:
    """The one mapping of storage outages to 503 (``app.storage.db.is_storage_outage``)."""
    return is_storage_outage(exc)
