"""The live dashboard at ``/ui``: server-rendered pages over the same queue, scoped like the API.

A browser signs in with an API token (``api.ui.session``); every page but sign-in needs that
cookie, every form carries a CSRF token, and each view sets ``g.identity`` from it so the very
scoping helpers of the JSON API (``api.auth``, ``api.jobs.visible_job``) decide what it may see.
Pages: jobs (``jobs_views``), bulk actions on a filter, their progress and the dead letters
(``bulk_views``), objectives (``objective_views``), schedules (``schedule_views``),
system (``system_views``).
Live updates arrive as Server-Sent Events on cookie-authenticated endpoints under ``/ui``; the
JSON API keeps taking only Bearer tokens.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Flask, Response, g, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import HTTPException

from api.context import state
from api.errors import JOB_NOT_FOUND_MESSAGE, ApiError
from api.ui import session
from app.jobs.errors import ConflictError, JobNotFound, ValidationError

BLUEPRINT = "ui"
blueprint = Blueprint(
    BLUEPRINT,
    __name__,
    url_prefix=session.UI_PREFIX,
    template_folder="templates",
    static_folder="static",
    static_url_path="/static",
)

# Reachable without a session: the sign-in form and the stylesheet/script it uses.
_PUBLIC = frozenset({f"{BLUEPRINT}.signin", f"{BLUEPRINT}.signin_submit", f"{BLUEPRINT}.static"})
# Endpoints that answer with Server-Sent Events (an error there is a bare status, not a page).
_EVENT_STREAMS = frozenset(
    {
        f"{BLUEPRINT}.jobs_live",
        f"{BLUEPRINT}.job_events",
        f"{BLUEPRINT}.objective_events",
        f"{BLUEPRINT}.operation_events",
    }
)
# Content-Security-Policy: nothing but this server's own files; no inline script, no framing.
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)


class UiError(Exception):
    """An error page: status, a title and a message (never anything the caller may not see)."""

    def __init__(self, status: int, title: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.title = title
        self.message = message


def current_session() -> session.Session:
    value: session.Session = g.ui_session
    return value


def wants_event_stream() -> bool:
    return request.endpoint in _EVENT_STREAMS or request.accept_mimetypes.best == "text/event-stream"


@blueprint.before_request
def _require_session() -> ResponseReturnValue | None:
    if request.method == "POST" and not session.same_origin():
        raise UiError(403, "Refused", "This form was posted from another site.")
    if request.endpoint in _PUBLIC:
        return None
    sess = session.current(state().engine)
    if sess is None:
        if request.method == "GET" and not wants_event_stream():
            return redirect(url_for(f"{BLUEPRINT}.signin", next=request.full_path.rstrip("?")))
        raise UiError(401, "Signed out", "Sign in again: your session ended or its token was revoked.")
    g.ui_session = sess
    # The JSON API's scoping helpers read the identity from here.
    g.identity = sess.identity
    if request.method == "POST" and not session.csrf_ok(sess, request.form.get(session.CSRF_FIELD)):
        raise UiError(
            403, "Refused", "This form is stale or was not sent by this dashboard: reload and retry."
        )
    return None


@blueprint.after_request
def _headers(response: Response) -> Response:
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers["X-Frame-Options"] = "DENY"
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    if request.endpoint != f"{BLUEPRINT}.static":
        # Pages show organisation data: no shared or back-button cache may keep them.
        response.headers["Cache-Control"] = "no-store"
    return response


@blueprint.context_processor
def _globals() -> dict[str, Any]:
    sess: session.Session | None = g.get("ui_session")
    who = None
    if sess is not None:
        who = "system: every organisation" if sess.identity.system else sess.identity.organization_id
    return {
        "ui_session": sess,
        "csrf": sess.csrf if sess else "",
        "who": who,
        "csrf_field": session.CSRF_FIELD,
    }


@blueprint.app_template_filter("ts")
def short_time(value: object) -> str:
    """``2026-01-02T03:04:05.678901Z`` → ``2026-01-02 03:04:05.678`` (UTC, as every page says)."""
    if not isinstance(value, str) or len(value) < 19 or value[10] != "T":
        return "" if value is None else str(value)
    return value[:10] + " " + value[11:23].rstrip("Z")


def error_page(status: int, title: str, message: str) -> ResponseReturnValue:
    if wants_event_stream():
        return Response(f": {title}\n\n", status=status, mimetype="text/event-stream")
    return render_template("error.html", title=title, message=message, status=status), status


@blueprint.errorhandler(UiError)
def _ui_error(exc: UiError) -> ResponseReturnValue:
    return error_page(exc.status, exc.title, exc.message)


@blueprint.errorhandler(ApiError)
def _api_error(exc: ApiError) -> ResponseReturnValue:
    titles = {404: "Not found", 403: "Forbidden", 409: "Conflict", 400: "Bad request"}
    return error_page(exc.status, titles.get(exc.status, "Error"), exc.message)


@blueprint.errorhandler(JobNotFound)
def _job_not_found(exc: JobNotFound) -> ResponseReturnValue:
    return error_page(404, "Not found", JOB_NOT_FOUND_MESSAGE)


@blueprint.errorhandler(ValidationError)
def _invalid(exc: ValidationError) -> ResponseReturnValue:
    # The message names the field and, for a closed set, the allowed values.
    return error_page(400, "Bad request", exc.message)


@blueprint.errorhandler(ConflictError)
def _conflict(exc: ConflictError) -> ResponseReturnValue:
    return error_page(409, "Conflict", str(exc))


@blueprint.errorhandler(HTTPException)
def _http(exc: HTTPException) -> ResponseReturnValue:
    status = exc.code or 500
    return error_page(status, exc.name, "This page does not exist." if status == 404 else exc.name)


def register(app: Flask) -> None:
    """Mount the dashboard on ``app`` (its views register on import)."""
    from api.ui import bulk_views, jobs_views, objective_views, schedule_views, signin_views, system_views

    del bulk_views, jobs_views, objective_views, schedule_views, signin_views, system_views
    app.register_blueprint(blueprint)
