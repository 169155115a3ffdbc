"""Liveness and readiness probes.

``/healthz`` says the process answers (no auth, no I/O: a probe must not fail because the
database is slow). ``/readyz`` says this instance can do its job: the database answers
``SELECT 1`` and the broker is reachable — Redis answers PING within a second, or, in the
embedded deployment, the local broker folder exists or can be created. A failed check names the
setting and the cause in the words of the start-up checks (``app/ops/preflight.py``) and since
when this process has found it down (``app/ops/outages.py``, which also logs the outage once);
the wake-up publisher
can publish (``api.wake``: its transport loads and the driver queue is declared), and every
recovery loop this deployment runs (``app/ops/loop_registry.py``) ran within three of its periods
(``loop_runs``): a deployment whose loops stopped (beat down and no consumer of their queues left)
recovers nothing, so it is not ready. A loop that never ran is given the same three periods from
this process's start; a loop whose schedule cannot run (an invalid cron) fails the check.

Both answer without a token, so a platform's HTTP health check can use them: ``/readyz`` then says
only ``{"status": "ok"}`` (200) or ``not ready`` (503). The checks' details (hosts, causes, each
loop's last run) are for a caller with a token (or any caller under ``RECEIPT_AUTH=disabled``).
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from flask import Blueprint, g, request
from flask.typing import ResponseReturnValue
from sqlalchemy import text
from sqlalchemy.engine import Engine

from api import auth, schemas
from api.context import read_connection, state
from api.errors import NOT_READY, ApiError
from api.openapi import Operation, operation
from api.wake import check_waker
from app.config import Settings
from app.ops import loop_registry, outages, preflight
from app.ops.preflight import BROKER, DATABASE, Problem
from app.storage import loop_claims
from app.storage.db import iso
from app.storage.files import private_dir

blueprint = Blueprint("health", __name__)

OK = "ok"
BROKER_TIMEOUT_SECONDS = 1.0


def _unreachable(dependency: str, problem: Problem) -> str:
    """The check's answer for a dependency found down, with the outage's start when known."""
    outages.observe(dependency, problem)
    watch = outages.current()
    outage = watch.down(dependency) if watch is not None else None
    since = f" (down since {iso(datetime.fromtimestamp(outage.since_wall, UTC))})" if outage else ""
    return f"unreachable: {dependency}: {problem.what}{since}"


def check_database(engine: Engine, settings: Settings) -> str:
    try:
        with read_connection(engine) as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # any failure means "not ready"; the description says which
        url = engine.url
        what, fix = preflight.describe_database_error(exc, url.host, url.port, url.database)
        return _unreachable(DATABASE, Problem(DATABASE, preflight.database_tried(settings), what, fix))
    outages.observe(DATABASE, None)
    return OK


def check_broker(settings: Settings) -> str:
    if settings.redis_url:
        problem = preflight.broker_problem(settings, timeout_s=BROKER_TIMEOUT_SECONDS)
        if problem is not None:
            return _unreachable(BROKER, problem)
        outages.observe(BROKER, None)
        return OK
    folder: Path = settings.home_path / "broker"
    try:
        private_dir(settings.home_path)
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"broker folder {folder} is not usable ({type(exc).__name__})"
    return OK


def check_loops(engine: Engine, settings: Settings, started: float) -> tuple[str, dict[str, Any]]:
    """Each active loop's last run, period and age; "ok" unless one is older than 3 periods."""
    try:
        now, runs = loop_claims.last_runs(engine)
    except Exception as exc:
        return f"unreadable ({type(exc).__name__})", {}
    since = now - timedelta(seconds=time.monotonic() - started)
    report: dict[str, Any] = {}
    late = []
    for loop in loop_registry.active(settings):
        run = runs.get(loop.name)
        st = loop_registry.status(loop, settings, run.started_at if run else None, since, now)
        report[loop.name] = {
            "lastRun": iso(st.last_run),
            "ageMs": st.age_ms,
            "intervalMs": st.interval_ms if st.interval_ms is not None else 0,
            "overdue": st.overdue,
        }
        if st.error is not None:
            report[loop.name]["error"] = st.error
        if st.overdue:
            late.append(loop.name)
    if late:
        return f"overdue: {', '.join(late)} (no run within {loop_claims.STALE_FACTOR} periods)", report
    return OK, report


@blueprint.get("/healthz")
@operation(
    Operation(
        summary="Liveness: the process answers.", tag="health", auth=False, responses={200: schemas.HEALTH}
    )
)
def healthz() -> ResponseReturnValue:
    return {"status": OK}


@blueprint.get("/readyz")
@operation(
    Operation(
        summary="Readiness: the database and the broker are reachable; wake-ups can be published; "
        "every recovery loop ran lately.",
        description="Answers without a token (200 or 503, for a platform's health check); the "
        "checks' details and each loop's last run need one.",
        tag="health",
        auth=False,
        errors=(401, 503),
        responses={200: schemas.READY},
    )
)
def readyz() -> ResponseReturnValue:
    st = state()
    detailed = bool(request.headers.get("Authorization", "").strip()) or st.settings.auth_disabled
    if detailed:
        # A token that is sent must be valid: a bad one is the same 401 as on every other route.
        g.identity = auth.authenticate(st.engine, auth_disabled=st.settings.auth_disabled)
    checks: dict[str, Any] = {
        "database": check_database(st.engine, st.settings),
        "broker": check_broker(st.settings),
        "wake": check_waker(st.waker),
    }
    checks["loops"], checks["loopRuns"] = check_loops(st.engine, st.settings, st.started_monotonic)
    failed = sorted(name for name, result in checks.items() if name != "loopRuns" and result != OK)
    if failed:
        message = "not ready: " + ", ".join(failed) + " failed"
        raise ApiError(503, NOT_READY, message, checks if detailed else None)
    return {"status": OK, **checks} if detailed else {"status": OK}
