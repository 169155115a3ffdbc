"""Liveness and readiness probes.

``/healthz`` says the process answers (no auth, no I/O: a probe must not fail because the
database is slow). ``/readyz`` says this instance can do its job: the database answers
``SELECT 1`` and the broker is reachable — Redis answers PING within a second, or, in the
embedded deployment, the local broker folder exists or can be created — and the wake-up
publisher can publish (``api.wake``: its transport loads and the driver queue is declared).
"""

from __future__ import annotations

from pathlib import Path

from flask import Blueprint
from flask.typing import ResponseReturnValue
from sqlalchemy import text
from sqlalchemy.engine import Engine

from api import schemas
from api.context import read_connection, state
from api.errors import NOT_READY, ApiError
from api.openapi import Operation, operation
from api.wake import check_waker
from app.config import Settings

blueprint = Blueprint("health", __name__)

OK = "ok"
BROKER_TIMEOUT_SECONDS = 1.0


def check_database(engine: Engine) -> str:
    try:
        with read_connection(engine) as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:  # any failure means "not ready"; the class name says which
        return f"unreachable ({type(exc).__name__})"
    return OK


def check_broker(settings: Settings) -> str:
    if settings.redis_url:
        import redis

        client = redis.Redis.from_url(
            settings.redis_url,
            socket_timeout=BROKER_TIMEOUT_SECONDS,
            socket_connect_timeout=BROKER_TIMEOUT_SECONDS,
        )
        try:
            client.ping()
        except Exception as exc:
            return f"unreachable ({type(exc).__name__})"
        finally:
            client.close()
        return OK
    folder: Path = settings.home_path / "broker"
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"broker folder {folder} is not usable ({type(exc).__name__})"
    return OK


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
        summary="Readiness: the database and the broker are reachable; wake-ups can be published.",
        tag="health",
        responses={200: schemas.READY},
    )
)
def readyz() -> ResponseReturnValue:
    st = state()
    checks = {
        "database": check_database(st.engine),
        "broker": check_broker(st.settings),
        "wake": check_waker(st.waker),
    }
    failed = sorted(name for name, result in checks.items() if result != OK)
    if failed:
        raise ApiError(503, NOT_READY, "not ready: " + ", ".join(failed) + " failed", checks)
    return checks
