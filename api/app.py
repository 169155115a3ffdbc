"""The API's app factory, ``create_app``: settings, engine, queue and wake-up wired by construction.

A module of its own, not ``api/__init__.py``, so importing one of the API's modules (``api.wake``,
``api.schemas``) does not build the whole package first.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from flask import Flask, Response, g, request
from flask.typing import ResponseReturnValue
from opentelemetry import context as otel_context
from sqlalchemy.engine import Engine

from api import (
    auth,
    errors,
    health,
    jobs,
    limits,
    objectives,
    openapi,
    organizations,
    schedules,
    streams,
    ui,
    whoami,
)
from api import metrics as metrics_view
from api.context import EXTENSION, ApiState
from api.ui.signin_views import browser_landing
from api.wake import default_waker
from app import tracing
from app.composition import build_queue
from app.config import Settings
from app.jobs.reducer import Job
from app.jobs.tracecontext import TRACEPARENT, TRACESTATE
from app.ops import metrics
from app.storage.db import engine_for

log = logging.getLogger("receipt.api")


# Requests that make no span: probes and scrapes, many a minute, part of no job's story.
UNTRACED_PATHS = "health,metrics"


def install_tracing(app: Flask) -> None:
    """Traces (``app.tracing``): with tracing on, OpenTelemetry's Flask instrumentation makes each
    request a server span, a child of the caller's ``traceparent``; a job enqueued in it records
    the span's context. With tracing off no span is made, but a caller's own ``traceparent`` is
    still recorded on the jobs it posts (one header lookup per request), so its trace goes on in
    whatever traces the caller's side."""
    if tracing.on():
        from opentelemetry.instrumentation.flask import FlaskInstrumentor

        FlaskInstrumentor.instrument_app(  # type: ignore[no-untyped-call]
            app, tracer_provider=tracing.provider(), excluded_urls=UNTRACED_PATHS
        )
        return

    @app.before_request
    def _caller_context() -> None:
        if TRACEPARENT in request.headers:
            ctx = tracing.extract({k: request.headers.get(k, "") for k in (TRACEPARENT, TRACESTATE)})
            if ctx is not None:
                g.trace_token = otel_context.attach(ctx)

    @app.teardown_request
    def _drop_caller_context(exc: BaseException | None) -> None:
        token = g.pop("trace_token", None)
        if token is not None:
            otel_context.detach(token)


def create_app(
    settings: Settings | None = None,
    *,
    engine: Engine | None = None,
    on_dispatchable: Callable[[Sequence[Job]], None] | None = None,
) -> Flask:
    """Build the API app.

    ``settings`` defaults to ``Settings.from_env()``; ``engine`` to one opened on its database;
    ``on_dispatchable`` (called after commit with jobs that became dispatchable) to the wake-up
    publisher (``api.wake``), which raises if it cannot be built. Tests pass a recording function
    so no broker is needed.
    """
    settings = settings if settings is not None else Settings.from_env()
    engine = engine if engine is not None else engine_for(settings)
    if on_dispatchable is None:
        on_dispatchable = default_waker(settings)

    app = Flask("api")
    # One byte over the limit, so a streamed body that exceeds it is detected rather than cut
    # (api.inputs.raw_body refuses anything past the limit itself, declared or streamed).
    app.config["MAX_CONTENT_LENGTH"] = settings.max_body_bytes + 1
    app.json.sort_keys = False  # type: ignore[attr-defined]
    queue = build_queue(settings, engine=engine, on_dispatchable=on_dispatchable)
    api_state = ApiState(settings, engine, queue, waker=on_dispatchable)
    app.extensions[EXTENSION] = api_state

    for blueprint in (
        jobs.blueprint,
        objectives.blueprint,
        schedules.blueprint,
        streams.blueprint,
        health.blueprint,
        openapi.blueprint,
        metrics_view.blueprint,
        whoami.blueprint,
        organizations.blueprint,
    ):
        app.register_blueprint(blueprint)
    errors.register_error_handlers(app, api_state.count_internal_error)
    ui.register(app)

    auth_disabled = settings.auth_disabled
    if auth_disabled:
        log.warning("RECEIPT_AUTH=disabled: the API accepts anonymous requests with system rights")

    @app.before_request
    def _authenticate() -> ResponseReturnValue | None:
        landing = browser_landing()
        if landing is not None:
            return landing  # a browser at / or /ui: the dashboard, which signs in by its own page
        if request.blueprint == ui.BLUEPRINT:
            return None  # the dashboard authenticates by its own cookie (api/ui/session.py), never Bearer
        op = openapi.operation_of(app, request.endpoint)
        if op is not None and not op.auth:
            return None
        if metrics_view.presents_metrics_token(settings, request.endpoint):
            g.identity = metrics_view.SCRAPER
            return None
        g.identity = auth.authenticate(engine, auth_disabled=auth_disabled)
        return None

    @app.after_request
    def _count(response: Response) -> Response:
        rule = request.url_rule
        metrics.observe_request(request.method, rule.rule if rule is not None else None, response.status_code)
        return response

    # After authentication (before_request hooks run in order): the write limit keys on the caller.
    limits.install_rate_limit(app, settings)
    install_tracing(app)

    if auth_disabled:

        @app.after_request
        def _warn(response: Response) -> Response:
            response.headers[auth.AUTH_WARNING_HEADER] = auth.AUTH_WARNING
            return response

    return app
