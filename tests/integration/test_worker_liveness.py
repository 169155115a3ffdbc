"""The worker-liveness loop on PostgreSQL: a process whose record lapsed past
``RECEIPT_WORKER_DEAD_AFTER_MS`` has its jobs expired at once (``job.lease_expired`` with the reason),
whatever their 7-minute leases say; a live process's jobs, and another identity's, are untouched."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.engine import Engine

from app.jobs import liveness as rules
from app.jobs.routing import DISPATCH_TASK
from app.ops import loop_registry
from app.storage import liveness as records
from app.storage.db import db_now, loop_runs, worker_liveness
from tests.support.queue_ops import lease
from workers import loop_passes

from .runtime_support import enqueue, receipts_of, recording_runtime, settings_for

SEVEN_MINUTES_MS = 7 * 60 * 1000
DEAD_AFTER_MS = 10_000


@pytest.fixture
def rt(pg_engine: Engine, redis_url: str) -> Iterator[Any]:
    runtime, sent, _ = recording_runtime(pg_engine, settings_for(redis_url), offer=False)
    runtime.sent = sent  # type: ignore[attr-defined]
    yield runtime


def age(engine: Engine, process: str, ms: int) -> None:
    """Set ``process``'s last renewal ``ms`` into the past (database clock)."""
    with engine.begin() as conn:
        now = db_now(conn)
        conn.execute(
            update(worker_liveness)
            .where(worker_liveness.c.process_id == process)
            .values(renewed_at=now - timedelta(milliseconds=ms))
        )


def leased_by(rt: Any, process: str, nonce: str) -> str:
    job = enqueue(rt.queue, "factory", kind="factory.run")
    assert lease(rt.queue, job.id, rules.holder_id(process, nonce), SEVEN_MINUTES_MS, start=True).applied
    return job.id


def test_a_lapsed_process_has_its_jobs_expired_at_once_with_the_reason(rt: Any) -> None:
    engine = rt.engine
    dead = rules.process_id("host-a:101", "aaaaaaaa")
    alive = rules.process_id("host-a:102", "bbbbbbbb")
    reborn = rules.process_id("host-a:101", "cccccccc")  # the same pid's later identity
    for p in (dead, alive, reborn):
        records.register(engine, p, "worker-codex")
    mine = [leased_by(rt, dead, "00000001"), leased_by(rt, dead, "00000002")]
    theirs = leased_by(rt, alive, "00000003")
    later = leased_by(rt, reborn, "00000004")
    age(engine, dead, DEAD_AFTER_MS + 500)
    age(engine, alive, DEAD_AFTER_MS - 3000)  # late, but not past the threshold
    rt.sent.clear()

    out = loop_passes.run(rt, loop_registry.WORKER_LIVENESS)

    assert out["dead"] == [dead]
    assert sorted(out["expired"]) == sorted(mine)
    for job_id in mine:
        expired = [r for r in receipts_of(engine, job_id) if r.type == "job.lease_expired"]
        assert len(expired) == 1
        assert expired[0].body["error"] == f"worker {dead} liveness lapsed"
        job = rt.queue.get(job_id)
        assert job is not None and job.status == "queued"  # requeued for redelivery at once
    # Each requeue woke the dispatcher in its own commit: redelivery needs no other pass.
    woken = {j for t in rt.sent.named(DISPATCH_TASK) for j in t.args[0]}
    assert woken == set(mine)
    for job_id in (theirs, later):
        job = rt.queue.get(job_id)
        assert job is not None and job.status == "running"
        assert "job.lease_expired" not in [r.type for r in receipts_of(engine, job_id)]
    with engine.connect() as conn:
        ran = conn.execute(select(loop_runs.c.name).where(loop_runs.c.name == "worker-liveness")).scalar()
    assert ran == "worker-liveness"  # claimed, like every loop

    # The dead identity can never be renewed again; a second pass declares nothing new.
    assert records.renew(engine, dead, "worker-codex") == "dead"
    assert records.renew(engine, alive, "worker-codex") == "renewed"
    again = records.expire_dead(rt.queue, DEAD_AFTER_MS)
    assert again == []


def test_a_renewal_that_lands_before_the_pass_keeps_the_process_alive(rt: Any) -> None:
    engine = rt.engine
    process = rules.process_id("host-b:7", "dddddddd")
    records.register(engine, process, "worker-chat")
    job_id = leased_by(rt, process, "00000009")
    age(engine, process, DEAD_AFTER_MS + 500)
    assert records.renew(engine, process, "worker-chat") == "renewed"
    assert records.expire_dead(rt.queue, DEAD_AFTER_MS) == []
    job = rt.queue.get(job_id)
    assert job is not None and job.status == "running"


def test_a_missing_record_is_rebuilt_by_the_next_renewal(rt: Any) -> None:
    engine = rt.engine
    process = rules.process_id("host-c:9", "eeeeeeee")
    assert records.renew(engine, process, "worker-chat") == "inserted"
    assert [r.process_id for r in records.records(engine)] == [process]
