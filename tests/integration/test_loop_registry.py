"""The loops as the registry runs them, on PostgreSQL: the spec's timing defaults with an injected
clock, the outbox redrive's held claim and observational timeout, and the Factory's loops under the
local ticker (no beat).

Spec ("Four independent recovery loops"): the queued-job redrive's first pass comes after a
5 000 ms startup delay; the objective-control outbox redrive runs every 5 000 ms, single-flight,
and its 15 000 ms timeout is observational only (a slower pass keeps ownership until it settles and
logs ``factory.control_outbox_redrive_slow``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.factory import service
from app.factory.plan import validate_objective
from app.factory.vocab import control_job_id
from app.jobs.routing import EXECUTE_TASK, MAINTENANCE_QUEUE
from app.ops import loop_registry
from app.storage import loop_claims
from app.storage.db import db_now, jobs, loop_runs, transaction
from app.storage.queue import Queue
from tests.support.clock import ManualClock
from workers import loop_passes
from workers.roles import ROLES
from workers.runtime import Runtime

from .runtime_support import Recorder, enqueue, recording_runtime, settings_for, wait_until

AUTH = {"userId": "u1", "organizationId": "org-loops"}
SLOW_EVENT = "factory.control_outbox_redrive_slow"
# Pushed out of the way, so a test sees only the loop it is about.
QUIET = "600000"


@pytest.fixture
def rt_of(pg_engine: Engine, redis_url: str) -> Iterator[Any]:
    def build(**env: str) -> tuple[Runtime, Recorder]:
        rt, sent, _ = recording_runtime(pg_engine, settings_for(redis_url, **env))
        return rt, sent

    yield build


def lost_control_message(engine: Engine, client_id: str) -> str:
    """An objective whose launch request is unconsumed and has no control job (its fast path never
    ran: the message was lost). Returns its key."""
    quiet = queue_for(engine, control_fast_path=False)
    body = {"objectiveId": client_id, "title": "t", "goal": "g", "authContext": AUTH}
    body["plan"] = {"tasks": [{"id": "A", "agentId": "x", "payload": {"kind": "factory.task.run"}}]}
    return service.launch(quiet, validate_objective(body), launched_by=service.system_launcher()).objective.id


def control_job(queue: Queue, key: str) -> Any:
    obj = service.get(queue.engine, key)
    assert obj is not None and obj.pending, "the request was consumed"
    return queue.get(control_job_id(key, obj.pending[0].seq))


def expires_at(engine: Engine, name: str) -> datetime:
    with engine.connect() as conn:
        value = conn.execute(select(loop_runs.c.expires_at).where(loop_runs.c.name == name)).scalar_one()
    assert isinstance(value, datetime)
    return value


# -- the queued redrive: its first pass 5 000 ms after start ------------------------------------------


def test_the_tickers_first_queued_redrive_comes_5000_ms_after_start_by_the_injected_clock(rt_of: Any) -> None:
    # The spec's defaults for the redrive (15 000 ms, first pass after 5 000 ms); the job is old
    # enough at once, and the other maintenance loops are pushed out of the way.
    rt, sent = rt_of(
        RECEIPT_RESONATE_QUEUED_REDRIVE_MIN_AGE_MS="0",
        RECEIPT_RESONATE_QUEUED_REDRIVE_COOLDOWN_MS="0",
        RECEIPT_LEASE_EXPIRY_INTERVAL_MS=QUIET,
        RECEIPT_RETRY_SCAN_INTERVAL_MS=QUIET,
        RECEIPT_SCHEDULE_SCAN_INTERVAL_MS=QUIET,
    )
    assert rt.settings.queued_redrive_startup_delay_ms == 5_000
    job = enqueue(rt.queue, "factory")
    sent.clear()
    clock = ManualClock()
    ticker = loop_passes.LocalTicker(rt, (MAINTENANCE_QUEUE,), clock=clock)
    assert ticker.tick() == []
    clock.advance_ms(4_999)
    assert ticker.tick() == []
    assert sent.named(EXECUTE_TASK) == []
    clock.advance_ms(1)
    assert ticker.tick() == [loop_registry.QUEUED_REDRIVE.name]
    # The redrive moves the job's line: its worker message leaves.
    assert [d.args[0] for d in sent.named(EXECUTE_TASK)] == [job.id]
    # One first pass; later ones follow the 15 000 ms interval (the database clock), not this clock.
    clock.advance_ms(60_000)
    assert ticker.tick() == []


def test_a_pass_since_start_makes_the_first_one_unneeded(rt_of: Any) -> None:
    rt, _ = rt_of(
        RECEIPT_LEASE_EXPIRY_INTERVAL_MS=QUIET,
        RECEIPT_RETRY_SCAN_INTERVAL_MS=QUIET,
        RECEIPT_SCHEDULE_SCAN_INTERVAL_MS=QUIET,
    )
    clock = ManualClock()
    ticker = loop_passes.LocalTicker(rt, (MAINTENANCE_QUEUE,), clock=clock)
    assert ticker.tick() == []
    assert "redriven" in loop_passes.redrive_queued(rt)  # beat's own first pass, say
    clock.advance_ms(5_000)
    assert ticker.tick() == []


# -- the outbox redrive: every 5 000 ms, single-flight, held while slow, timeout observational ---------


def test_the_outbox_redrive_runs_a_tick_5000_ms_after_the_last_and_skips_a_duplicate(rt_of: Any) -> None:
    rt, _ = rt_of()
    assert rt.settings.objective_control_outbox_redrive_interval_ms == 5_000
    outbox = loop_registry.OUTBOX_REDRIVE
    assert "controlJobs" in loop_passes.run(rt, outbox)

    def started_ago(ms: int) -> None:
        with transaction(rt.engine) as conn:
            started = db_now(conn) - timedelta(milliseconds=ms)
            conn.execute(loop_runs.update().where(loop_runs.c.name == outbox.name).values(started_at=started))

    started_ago(2_000)  # a second beat's tick for the same period: coalesced
    assert loop_passes.run(rt, outbox) == {"skipped": True}
    started_ago(5_000)  # the next tick of the 5 000 ms schedule
    assert "controlJobs" in loop_passes.run(rt, outbox)


def test_a_slow_outbox_pass_keeps_ownership_and_only_logs_past_15000_ms(
    rt_of: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    rt, _ = rt_of()
    assert rt.settings.objective_control_outbox_redrive_timeout_ms == 15_000
    key = lost_control_message(rt.engine, "slow-1")
    outbox = loop_registry.OUTBOX_REDRIVE
    clock = ManualClock()
    real = service.redrive_outbox
    seen: dict[str, Any] = {}

    def slow_redrive(queue: Queue, **kwargs: Any) -> dict[str, Any]:
        clock.advance_ms(14_999)
        seen["before"] = SLOW_EVENT in caplog.text
        clock.advance_ms(2)  # 15 001 ms into the pass
        seen["during"] = SLOW_EVENT in caplog.text
        # Still running, it keeps the loop: another pass cannot take it ...
        seen["intruder"] = loop_claims.claim(
            rt.engine, outbox.name, "intruder", min_interval_ms=0, ttl_ms=60_000
        )
        # ... and its claim is renewed in the background, not only when it reaches an item.
        first = expires_at(rt.engine, outbox.name)
        wait_until(lambda: expires_at(rt.engine, outbox.name) > first, timeout=15, what="a renewal")
        return real(queue, **kwargs)

    monkeypatch.setattr(service, "redrive_outbox", slow_redrive)
    with caplog.at_level(logging.INFO, logger="receipt.loops"):
        result = loop_passes.run(rt, outbox, clock=clock)
    assert seen == {"before": False, "during": True, "intruder": False}
    # It ran to the end and did its work: the lost control message has its control job now.
    assert result["controlJobs"] == [control_job(rt.queue, key).id]
    assert f"{SLOW_EVENT}: objective-outbox-redrive pass still running after 15000 ms" in caplog.text
    assert f"{SLOW_EVENT}: objective-outbox-redrive pass took 15001 ms (timeout 15000 ms)" in caplog.text


def test_an_outbox_pass_within_its_timeout_logs_nothing_slow(
    rt_of: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    rt, _ = rt_of()
    clock = ManualClock()
    real = service.redrive_outbox

    def redrive(queue: Queue, **kwargs: Any) -> dict[str, Any]:
        clock.advance_ms(14_999)  # just within the deadline
        return real(queue, **kwargs)

    monkeypatch.setattr(service, "redrive_outbox", redrive)
    with caplog.at_level(logging.DEBUG, logger="receipt.loops"):
        result = loop_passes.run(rt, loop_registry.OUTBOX_REDRIVE, clock=clock)
    assert result["controlJobs"] == []
    assert "loop objective-outbox-redrive: pass finished" in caplog.text
    assert SLOW_EVENT not in caplog.text


# -- the Factory's loops without beat ------------------------------------------------------------------


def test_without_beat_the_control_workers_ticker_runs_the_factorys_loops(rt_of: Any) -> None:
    rt, _ = rt_of(
        RECEIPT_OBJECTIVE_CONTROL_OUTBOX_REDRIVE_INTERVAL_MS="1000",
        RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_TEST_TICK_S="1",
        RECEIPT_RESONATE_QUEUED_REDRIVE_INTERVAL_MS=QUIET,
        RECEIPT_LEASE_EXPIRY_INTERVAL_MS=QUIET,
        RECEIPT_RETRY_SCAN_INTERVAL_MS=QUIET,
        RECEIPT_SCHEDULE_SCAN_INTERVAL_MS=QUIET,
    )
    key = lost_control_message(rt.engine, "lost-1")
    assert control_job(rt.queue, key) is None
    ticker = loop_passes.LocalTicker(rt, ROLES["worker-control"].queues)
    assert {loop.name for loop in ticker.loops} >= {"objective-outbox-redrive", "objective-watchdog"}
    ran: set[str] = set()

    def factory_loops_ran() -> bool:
        ran.update(ticker.tick())
        return {"objective-outbox-redrive", "objective-watchdog"} <= ran

    wait_until(factory_loops_ran, timeout=15, what="the ticker to run both Factory loops")
    job = control_job(rt.queue, key)
    assert job is not None and job.status == "queued"  # the lost control message is redriven
    with rt.engine.connect() as conn:
        watchdog_jobs = (
            conn.execute(select(jobs.c.id).where(jobs.c.kind == "factory.objective.watchdog")).scalars().all()
        )
    # The watchdog tick enqueued its tick's job, in the system's organisation.
    assert watchdog_jobs and all(j.startswith("_system/watchdog:") for j in watchdog_jobs)


def test_the_archive_pass_runs_claimed_with_its_settings_and_counts_what_it_moved(
    rt_of: Any, tmp_path: Any
) -> None:
    from sqlalchemy import update

    from app.ops import metrics
    from app.retention.sink import DirectorySink
    from tests.support.queue_ops import complete, lease

    rt, _ = rt_of(
        RECEIPT_RETENTION_DAYS="30",
        RECEIPT_ARCHIVE_DIR=str(tmp_path / "segments"),
        RECEIPT_ARCHIVE_PAGE_SIZE="2",
    )
    assert loop_registry.ARCHIVE in loop_registry.active(rt.settings)
    keys = []
    for _ in range(3):
        key = enqueue(rt.queue, "codex").id
        lease(rt.queue, key, "w1", 60_000)
        complete(rt.queue, key, "w1", 1, {})
        keys.append(key)
    # The projection says when each ended (it is what the pass selects by): forty days ago.
    with transaction(rt.engine) as conn:
        conn.execute(
            update(jobs)
            .where(jobs.c.id.in_(keys))
            .values(status_changed_at=jobs.c.status_changed_at - timedelta(days=40))
        )
    m = metrics.registry_metrics()
    before = (m.archived_streams.labels("job")._value.get(), m.archived_bytes._value.get())
    result = loop_passes.run(rt, loop_registry.ARCHIVE)
    assert (result["streams"], result["jobs"], result["pages"]) == (3, 3, 2)
    assert sorted(DirectorySink(tmp_path / "segments").names()) == sorted(result["segments"])
    assert m.archived_streams.labels("job")._value.get() - before[0] == 3
    assert m.archived_bytes._value.get() - before[1] == result["bytes"] > 0
    with rt.engine.connect() as conn:
        assert conn.execute(select(jobs.c.id).where(jobs.c.id.in_(keys))).all() == []
        ran = conn.execute(select(loop_runs.c.finished_at).where(loop_runs.c.name == "archive")).scalar_one()
    assert ran is not None
    # A tick right after is a duplicate (half a period): skipped.
    assert loop_passes.run(rt, loop_registry.ARCHIVE) == {"skipped": True}
