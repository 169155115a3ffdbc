"""A session idle inside a transaction is ended by PostgreSQL after
``RECEIPT_DB_IDLE_IN_TRANSACTION_MS`` (default 10000), and its locks go with it: a process frozen
or cut off mid-pass does not keep every other process's pass of that queue waiting."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from app.config import Settings
from app.dispatch import line
from app.jobs.routing import QUEUES
from app.storage.db import db_now, engine_for, lock_keys, transaction
from workers.liveness import liveness_engine

CHAT = QUEUES["chat"]


def _settings(url: str, **values: object) -> Settings:
    return Settings(database_url=url, **values)  # type: ignore[arg-type]


def _timeout(engine: Engine) -> str:
    with engine.connect() as conn:
        return str(conn.execute(text("SHOW idle_in_transaction_session_timeout")).scalar())


def test_the_default_is_10000_ms() -> None:
    assert Settings.from_env({}).db_idle_in_transaction_ms == 10_000


@pytest.mark.parametrize("value", ["-1", "600001", "soon"])
def test_a_value_outside_0_to_600000_names_the_setting_and_the_range(value: str) -> None:
    with pytest.raises(ValueError, match="RECEIPT_DB_IDLE_IN_TRANSACTION_MS") as bad:
        Settings.from_env({"RECEIPT_DB_IDLE_IN_TRANSACTION_MS": value})
    if value != "soon":
        assert "0 (no limit) to 600000 ms" in str(bad.value)


def test_every_session_of_a_process_carries_the_timeout_across_pool_reuse(pg_database_url: str) -> None:
    engine = engine_for(_settings(pg_database_url))
    liveness = liveness_engine(_settings(pg_database_url, db_idle_in_transaction_ms=2500))
    try:
        assert _timeout(engine) == "10s"
        # Checked in (the pool rolls back) and out again: the committed SET stays.
        assert _timeout(engine) == "10s"
        assert _timeout(liveness) == "2500ms"
    finally:
        engine.dispose()
        liveness.dispose()
    unlimited = engine_for(_settings(pg_database_url, db_idle_in_transaction_ms=0))
    try:
        assert _timeout(unlimited) == "0"  # the server's default, left alone
    finally:
        unlimited.dispose()


def test_a_pass_waiting_on_a_stalled_sessions_queue_lock_runs_once_the_server_ends_that_session(
    pg_database_url: str,
) -> None:
    stalled_engine = engine_for(_settings(pg_database_url, db_idle_in_transaction_ms=500))
    other = engine_for(_settings(pg_database_url, db_idle_in_transaction_ms=0))
    passed = threading.Event()
    failures: list[BaseException] = []

    def pass_of_the_queue() -> None:
        try:
            with transaction(other) as conn:
                line.run_pass(conn, CHAT, Settings(dispatch_lead=0), db_now(conn))
            passed.set()
        except BaseException as exc:
            failures.append(exc)

    try:
        with stalled_engine.connect() as stalled:
            stalled.begin()
            lock_keys(stalled, [f"dispatch:{CHAT}"])  # the lock a pass of this queue holds
            waiter = threading.Thread(target=pass_of_the_queue, daemon=True)
            waiter.start()
            assert not passed.wait(0.2)  # the lock is held: the pass waits (the timeout is 500 ms)
            # The stalled session says nothing more; the server ends it, and the pass takes the lock.
            assert passed.wait(15), failures or "the pass still waits on the stalled session's lock"
            waiter.join(5)
            assert not failures
            with pytest.raises(DBAPIError, match=r"idle-in-transaction timeout|server closed the connection"):
                stalled.execute(text("SELECT 1"))
    finally:
        stalled_engine.dispose()
        other.dispose()
