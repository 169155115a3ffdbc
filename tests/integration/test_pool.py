"""Pooled Postgres connections: pinged at checkout only after sitting idle, so a busy
process skips the ping round trip while a connection that went stale while idle is replaced."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.pool import NullPool

from app.storage import db
from app.storage.retry import is_transient


@pytest.fixture
def engine(pg_database_url: str) -> Iterator[Engine]:
    engine = db.make_engine(pg_database_url, pool_size=1, max_overflow=0)
    yield engine
    engine.dispose()


def backend_pid(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def terminate(url: str, pid: int) -> None:
    killer = create_engine(url, poolclass=NullPool)
    try:
        with killer.connect() as conn:
            assert conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar_one()
    finally:
        killer.dispose()


def test_a_connection_reused_at_once_is_not_pinged(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(db, "IDLE_PING_AFTER_S", 3600.0)
    backend_pid(engine)
    pings: list[object] = []

    def ping(conn: object) -> bool:
        pings.append(conn)
        return True

    monkeypatch.setattr(engine.dialect, "do_ping", ping)
    backend_pid(engine)
    assert pings == []


def test_a_connection_that_sat_idle_is_pinged_and_replaced_when_dead(
    engine: Engine, pg_database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = backend_pid(engine)
    terminate(pg_database_url, first)
    monkeypatch.setattr(db, "IDLE_PING_AFTER_S", 0.0)  # every checked-in connection counts as idle
    second = backend_pid(engine)  # no error: the ping found it dead and the pool opened another
    assert second != first


def test_a_stale_connection_used_within_the_idle_window_fails_as_a_transient_error(
    engine: Engine, pg_database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = backend_pid(engine)
    terminate(pg_database_url, first)
    monkeypatch.setattr(db, "IDLE_PING_AFTER_S", 3600.0)
    with pytest.raises(DBAPIError) as caught:
        backend_pid(engine)
    assert is_transient(caught.value)  # settlements retry it (5 attempts), the API answers 503
    assert backend_pid(engine) != first  # and the pool has already replaced the connection
