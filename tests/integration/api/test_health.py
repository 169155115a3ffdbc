"""/healthz and /readyz: liveness without I/O; readiness of the database and the broker."""

from __future__ import annotations

import logging
import re
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine, make_url

from api import auth
from api.auth import Identity
from app.ops import outages
from app.storage.db import make_engine
from tests.support.api import Api, build_api, json_of, make_settings
from tests.support.services import TcpProxy

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone


def test_readyz_embedded_broker_folder(api: Api) -> None:
    response = api.client.get("/readyz", headers=api.headers())
    assert response.status_code == 200
    body = json_of(response)
    assert {k: body[k] for k in ("database", "broker", "wake", "loops")} == dict.fromkeys(
        ("database", "broker", "wake", "loops"), "ok"
    )
    assert (api.state.settings.home_path / "broker").is_dir()


@pytest.mark.redis
def test_readyz_with_redis(sqlite_api: Api, redis_url: str) -> None:
    sqlite_api.state.settings = replace(sqlite_api.state.settings, redis_url=redis_url)
    response = sqlite_api.client.get("/readyz", headers=sqlite_api.headers())
    assert response.status_code == 200
    body = json_of(response)
    assert (body["database"], body["broker"], body["wake"]) == ("ok", "ok", "ok")


def test_readyz_is_503_naming_an_unreachable_redis(sqlite_api: Api) -> None:
    # Port 1 on loopback: nothing listens, so the connection is refused at once.
    sqlite_api.state.settings = replace(sqlite_api.state.settings, redis_url="redis://127.0.0.1:1/0")
    response = sqlite_api.client.get("/readyz", headers=sqlite_api.headers())
    assert response.status_code == 503
    error = json_of(response)["error"]
    assert error["code"] == "not_ready"
    assert "broker" in error["message"]
    assert error["details"]["database"] == "ok"
    assert error["details"]["broker"] == (
        "unreachable: REDIS_URL: no Redis answers at 127.0.0.1:1 (connection refused)"
    )


def test_readyz_says_since_when_the_processs_watch_found_the_broker_down(
    sqlite_api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    """In a deployed web process (gunicorn installs the watch per worker) the outage has a start,
    and the check's failure is the process's one log line about it."""
    settings = replace(sqlite_api.state.settings, redis_url="redis://127.0.0.1:1/0")
    sqlite_api.state.settings = settings
    outages.install(settings, database=False)
    try:
        with caplog.at_level(logging.INFO, logger=outages.LOGGER):
            first = json_of(sqlite_api.client.get("/readyz", headers=sqlite_api.headers()))
            second = json_of(sqlite_api.client.get("/readyz", headers=sqlite_api.headers()))
    finally:
        outages.uninstall()
    said = first["error"]["details"]["broker"]
    assert re.fullmatch(
        r"unreachable: REDIS_URL: no Redis answers at 127\.0\.0\.1:1 \(connection refused\) "
        r"\(down since \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d+Z\)",
        said,
    ), said
    assert second["error"]["details"]["broker"] == said  # the same outage, the same start
    lines = [r.getMessage() for r in caplog.records if r.name == outages.LOGGER]
    assert lines == [
        "REDIS_URL=redis://127.0.0.1:1/0: lost — no Redis answers at 127.0.0.1:1 (connection refused); "
        "start redis-server there, or set REDIS_URL to a server that runs (retrying every 1 s; one more "
        "line when it answers)"
    ]


def test_readyz_is_503_when_the_broker_folder_cannot_be_created(sqlite_api: Api, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    sqlite_api.state.settings = replace(sqlite_api.state.settings, home=str(blocker))
    response = sqlite_api.client.get("/readyz", headers=sqlite_api.headers())
    assert response.status_code == 503
    assert "broker" in json_of(response)["error"]["message"]


def test_readyz_is_503_naming_an_unreachable_database(
    sqlite_engine: Engine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    api = build_api(sqlite_engine, make_settings(tmp_path))
    # Authentication needs the database too, so swap the engine only after the token check runs.
    broken = make_engine("postgresql+psycopg2://nobody@127.0.0.1:1/none", pool_pre_ping=False)
    headers = api.headers()
    real_authenticate = auth.authenticate

    def authenticate_then_break_the_database(engine: Engine, *, auth_disabled: bool) -> Identity:
        identity = real_authenticate(engine, auth_disabled=auth_disabled)
        api.state.engine = broken
        return identity

    monkeypatch.setattr(auth, "authenticate", authenticate_then_break_the_database)

    response = api.client.get("/readyz", headers=headers)
    broken.dispose()
    assert response.status_code == 503
    error = json_of(response)["error"]
    assert error["details"]["database"] == (
        "unreachable: DATABASE_URL: no PostgreSQL answers at 127.0.0.1:1 (connection refused)"
    )
    assert error["details"]["broker"] == "ok"
    assert api.state.internal_errors == 0


def test_database_outage_on_a_normal_request_is_503_not_500(sqlite_engine: Engine, tmp_path: Path) -> None:
    broken = make_engine("postgresql+psycopg2://nobody@127.0.0.1:1/none", pool_pre_ping=False)
    api = build_api(sqlite_engine, make_settings(tmp_path))
    headers = api.headers()
    api.app.before_request_funcs[None].insert(0, lambda: setattr(api.state.queue, "engine", broken))
    response = api.client.get("/jobs/some-job", headers=headers)
    broken.dispose()
    assert response.status_code == 503
    assert json_of(response)["error"]["code"] == "unavailable"
    assert response.headers["Retry-After"] == "1"
    assert api.state.internal_errors == 0


def test_healthz_does_no_io(sqlite_engine: Engine, tmp_path: Path) -> None:
    api = build_api(sqlite_engine, make_settings(tmp_path))
    sqlite_engine.dispose()
    api.state.engine = make_engine("postgresql+psycopg2://nobody@127.0.0.1:1/none")
    assert api.client.get("/healthz").status_code == 200


def test_readyz_reports_each_loops_last_run_and_fails_when_one_is_older_than_three_intervals(
    sqlite_api: Api,
) -> None:
    """/readyz reports each recovery loop's last run and fails past 3x its interval."""
    from datetime import timedelta

    from app.ops import loop_registry
    from app.storage.db import db_now, loop_runs, transaction

    api = sqlite_api
    settings = replace(api.state.settings, queued_redrive_interval_ms=1000)
    api.state.settings = settings
    with transaction(api.state.engine) as conn:
        now = db_now(conn)
        for loop in loop_registry.active(settings):
            conn.execute(
                loop_runs.insert().values(name=loop.name, started_at=now, finished_at=now, owner="t")
            )
    fresh = api.client.get("/readyz", headers=api.headers())
    assert fresh.status_code == 200
    runs = json_of(fresh)["loopRuns"]
    # The Factory's two loops are checked too (no callback URL here: no callback sender).
    assert set(runs) == {
        "queued-redrive",
        "due-retries",
        "lease-expiry",
        "objective-outbox-redrive",
        "objective-watchdog",
        "schedules",
        "worker-liveness",
        "lost-deliveries",
    }
    assert runs["queued-redrive"]["intervalMs"] == 1000 and runs["queued-redrive"]["overdue"] is False
    assert runs["queued-redrive"]["lastRun"] is not None

    with transaction(api.state.engine) as conn:  # the redrive last ran 3.5 intervals ago
        conn.execute(
            loop_runs.update()
            .where(loop_runs.c.name == "queued-redrive")
            .values(started_at=now - timedelta(milliseconds=3500))
        )
    late = api.client.get("/readyz", headers=api.headers())
    assert late.status_code == 503
    error = json_of(late)["error"]
    assert "loops" in error["message"]
    assert error["details"]["loops"].startswith("overdue: queued-redrive")
    assert error["details"]["loopRuns"]["queued-redrive"]["overdue"] is True
    assert error["details"]["loopRuns"]["due-retries"]["overdue"] is False


# -- /readyz for a platform's health check: no token ---------------------------------------------------


def test_readyz_without_a_token_answers_the_status_alone(api: Api) -> None:
    response = api.client.get("/readyz")
    assert response.status_code == 200
    assert json_of(response) == {"status": "ok"}
    detailed = json_of(api.client.get("/readyz", headers=api.headers()))
    assert detailed["status"] == "ok" and detailed["database"] == "ok" and "loopRuns" in detailed


def test_readyz_with_a_bad_token_is_401(api: Api) -> None:
    response = api.client.get("/readyz", headers={"Authorization": "Bearer rcpt_not-a-real-token"})
    assert response.status_code == 401
    assert json_of(response)["error"]["code"] == "invalid_token"


def test_readyz_without_a_token_is_503_while_postgresql_is_down_and_200_once_it_is_back(
    pg_database_url: str, tmp_path: Path
) -> None:
    """A platform's probe through a proxy that drops every connection to PostgreSQL and refuses new
    ones (a restart, seen from the web process), then lets them through again."""
    url = make_url(pg_database_url)
    assert url.host is not None and url.port is not None, pg_database_url
    proxy = TcpProxy(url.host, url.port)
    engine = make_engine(url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False))
    try:
        api = build_api(engine, make_settings(tmp_path))
        assert api.client.get("/readyz").status_code == 200
        proxy.cut()
        down = api.client.get("/readyz")
        assert down.status_code == 503
        error = json_of(down)["error"]
        assert (error["code"], error["message"]) == ("not_ready", "not ready: database, loops failed")
        assert "details" not in error or error["details"] is None  # causes and hosts need a token
        proxy.restore()
        back = api.client.get("/readyz")
        assert (back.status_code, json_of(back)) == (200, {"status": "ok"})
        assert api.state.internal_errors == 0
    finally:
        proxy.close()
        engine.dispose()
