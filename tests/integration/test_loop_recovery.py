"""Loops that survive their own death, and recovery without beat.

A redrive pass whose database goes away mid-pass cannot release its claim; the claim's deadline
frees the loop about one interval later (not ten). The local ticker runs a loop whose last run is
older than three intervals, through the same single-flight claim.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import OperationalError

from app.jobs.routing import EXECUTE_BATCH_TASK, EXECUTE_TASK
from app.storage import loop_claims
from app.storage.db import loop_runs, make_engine
from delivery import dispatch
from tests.support.services import TcpProxy
from workers import loop_passes

from .runtime_support import enqueue, recording_runtime, settings_for, wait_until

INTERVAL_MS = 1000


@pytest.fixture
def proxied(pg_database_url: str, redis_url: str) -> Iterator[tuple[Any, TcpProxy]]:
    # The proxy stands in front of whichever PostgreSQL this session uses (a private one on a free
    # port under RECEIPT_TEST_PRIVATE_SERVICES), and the pass's engine reaches it only through it.
    url = make_url(pg_database_url)
    assert url.host is not None and url.port is not None, pg_database_url
    proxy = TcpProxy(url.host, url.port)
    engine = make_engine(url.set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False))
    settings = settings_for(
        redis_url,
        RECEIPT_RESONATE_QUEUED_REDRIVE_INTERVAL_MS=str(INTERVAL_MS),
        RECEIPT_RESONATE_QUEUED_REDRIVE_MIN_AGE_MS="0",
        RECEIPT_RESONATE_QUEUED_REDRIVE_COOLDOWN_MS="0",
    )
    try:
        yield recording_runtime(engine, settings), proxy
    finally:
        proxy.close()
        engine.dispose()


def test_a_redrive_pass_cut_from_postgres_mid_pass_frees_its_loop_within_about_an_interval(
    proxied: Any, pg_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    (rt, sent, _), proxy = proxied
    ids = [enqueue(rt.queue, "factory").id for _ in range(3)]
    sent.clear()
    real_pass = dispatch.dispatch_queue
    calls = {"n": 0}

    def pass_then_lose_the_database(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 1:
            proxy.cut()  # Postgres "restarts" under the pass: every connection dies, none can open
        return real_pass(*args, **kwargs)

    monkeypatch.setattr("workers.loop_passes.dispatch_queue", pass_then_lose_the_database)
    # The pass loses its database, and so does its release (it may end quietly: each line's pass
    # is its own, and the next interval retries it).
    with contextlib.suppress(OperationalError):
        loop_passes.redrive_queued(rt)
    assert sent.named(EXECUTE_TASK) == [] and sent.named(EXECUTE_BATCH_TASK) == []
    with pg_engine.connect() as conn:
        row = conn.execute(select(loop_runs).where(loop_runs.c.name == loop_passes.REDRIVE_LOOP)).one()
    assert row.finished_at is None, "the release reached a dead database, yet the row says released"
    assert row.expires_at - row.started_at == timedelta(milliseconds=loop_claims.claim_ttl_ms(INTERVAL_MS))

    proxy.restore()
    monkeypatch.setattr("workers.loop_passes.dispatch_queue", real_pass)
    # Right after recovery the dead pass still holds the loop (its deadline has not passed) ...
    assert loop_passes.redrive_queued(rt) == {"skipped": True}
    freed_at = time.monotonic()
    # ... and the next tick after the deadline runs (before: only after ten intervals).
    redriven = wait_until(
        lambda: loop_passes.redrive_queued(rt).get("redriven"), timeout=30, what="a redrive pass to run"
    )
    waited = time.monotonic() - freed_at
    assert sorted(redriven) == sorted(ids)
    assert waited < 10 * INTERVAL_MS / 1000, f"the loop stayed held {waited:.1f} s"


def test_a_long_pass_renews_its_claim_so_no_second_pass_starts_beside_it(
    engine: Engine, redis_url: str
) -> None:
    rt, _, _ = recording_runtime(engine, settings_for(redis_url))
    owner = "long-pass"
    # A deadline of one second: the pass renews after a third of it, so a stall of up to two
    # thirds (a loaded machine, a SQLite writer's lock) does not cost it the claim.
    ttl_ms = 1000
    assert loop_claims.claim(engine, "loop-long", owner, min_interval_ms=0, ttl_ms=ttl_ms)
    keep = loop_claims.KeepAlive(rt.engine, "loop-long", owner, ttl_ms)
    deadline = time.monotonic() + 1.5 * ttl_ms / 1000  # past its first deadline, renewed as it goes
    while time.monotonic() < deadline:
        keep()
        assert loop_claims.claim(engine, "loop-long", "intruder", min_interval_ms=0, ttl_ms=ttl_ms) is False
        time.sleep(0.02)
    # Once it stops renewing, the claim lapses and the intruder's pass may run; the old pass
    # learns it lost the loop the next time it tries to renew.
    time.sleep(1.2 * ttl_ms / 1000)
    assert loop_claims.claim(engine, "loop-long", "intruder", min_interval_ms=0, ttl_ms=ttl_ms) is True
    with pytest.raises(loop_claims.LoopClaimLost):
        keep()


def test_overdue_is_three_intervals_counting_a_loop_that_never_ran_from_the_process_start() -> None:
    from datetime import UTC, datetime

    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    ms = timedelta(milliseconds=1)
    assert loop_passes.STALE_FACTOR == 3 and loop_passes.TICKER_FACTOR == 2
    assert not loop_passes.overdue(t0, t0, t0 + 2000 * ms, 1000, loop_passes.TICKER_FACTOR)
    assert loop_passes.overdue(t0, t0, t0 + 2001 * ms, 1000, loop_passes.TICKER_FACTOR)
    assert not loop_passes.overdue(t0, t0, t0 + 3000 * ms, 1000)
    assert loop_passes.overdue(t0, t0, t0 + 3001 * ms, 1000)
    assert not loop_passes.overdue(None, t0, t0 + 2000 * ms, 1000)  # grace after start
    assert loop_passes.overdue(None, t0, t0 + 3001 * ms, 1000)


def test_the_local_ticker_runs_an_overdue_loop_once_and_leaves_a_fresh_one_alone(
    engine: Engine, redis_url: str
) -> None:
    rt, sent, _ = recording_runtime(
        engine,
        settings_for(
            redis_url,
            # One second: long enough that "they just ran" holds on a loaded machine too.
            RECEIPT_RESONATE_QUEUED_REDRIVE_INTERVAL_MS="1000",
            RECEIPT_RESONATE_QUEUED_REDRIVE_MIN_AGE_MS="0",
            RECEIPT_RESONATE_QUEUED_REDRIVE_COOLDOWN_MS="0",
            RECEIPT_RETRY_SCAN_INTERVAL_MS="1000",
            RECEIPT_LEASE_EXPIRY_INTERVAL_MS="1000",
            RECEIPT_SCHEDULE_SCAN_INTERVAL_MS="600000",  # another test's subject
            RECEIPT_LOST_DELIVERY_SCAN_INTERVAL_MS="600000",  # and this one
        ),
    )
    job = enqueue(rt.queue, "factory")
    sent.clear()
    ticker = loop_passes.LocalTicker(rt)
    assert ticker.tick() == []  # first look: nothing ran yet, but the grace has not passed
    ran = wait_until(ticker.tick, timeout=10, what="the ticker to find the loops overdue")
    assert set(ran) == {loop_passes.REDRIVE_LOOP, loop_passes.RETRY_LOOP, loop_passes.EXPIRY_LOOP}
    assert [t.args[0] for t in sent.named(EXECUTE_TASK)] == [job.id]
    assert ticker.tick() == []  # they just ran: not overdue
