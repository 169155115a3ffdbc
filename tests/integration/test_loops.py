"""The recovery loops: single-flight claims, queued-job redrive and lease expiry.

Spec: "Four independent recovery loops" — the redrive is guarded by a minimum age and a cooldown,
and its dispatch key ``<jobId>:redrive:<a>:<b>`` makes a pass idempotent for one observed queue
state; lease expiry appends ``job.lease_expired`` (database clock) so the redrive path recovers.
The loops run against a real Celery app on the Redis test database whose ``send_task`` records.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine

from app.jobs.routing import DISPATCH_TASK, DRIVER_QUEUE, EXECUTE_BATCH_TASK, EXECUTE_TASK, route
from app.storage import loop_claims
from app.storage.db import db_now, deliveries, loop_runs, transaction
from delivery.dispatch import dispatch_jobs
from tests.support.queue_ops import lease, settle_deliveries
from tests.support.tracing import Spans
from workers import loop_passes
from workers.runtime import Runtime

from .runtime_support import (
    Recorder,
    RecordingCallbacks,
    enqueue,
    recording_runtime,
    settings_for,
    types_of,
    wait_lease_past_deadline,
)

LONG_MS = 600_000


# -- the single-flight claim -----------------------------------------------------------------------


def test_claim_is_single_flight(engine: Engine) -> None:
    assert loop_claims.claim(engine, "loop-a", "owner-1", min_interval_ms=0, ttl_ms=LONG_MS) is True
    assert loop_claims.claim(engine, "loop-a", "owner-2", min_interval_ms=0, ttl_ms=LONG_MS) is False
    assert loop_claims.claim(engine, "loop-a", "owner-1", min_interval_ms=0, ttl_ms=LONG_MS) is False
    loop_claims.release(engine, "loop-a", "owner-1")
    assert loop_claims.claim(engine, "loop-a", "owner-2", min_interval_ms=0, ttl_ms=LONG_MS) is True


def test_claim_respects_the_interval_after_release(engine: Engine) -> None:
    assert loop_claims.claim(engine, "loop-a", "owner-1", min_interval_ms=LONG_MS, ttl_ms=LONG_MS)
    loop_claims.release(engine, "loop-a", "owner-1")
    # Released, but the previous pass started less than an interval ago: a duplicate tick.
    assert loop_claims.claim(engine, "loop-a", "owner-2", min_interval_ms=LONG_MS, ttl_ms=LONG_MS) is False
    assert loop_claims.claim(engine, "loop-a", "owner-2", min_interval_ms=0, ttl_ms=LONG_MS) is True


def test_release_by_a_non_owner_does_not_free_the_claim(engine: Engine) -> None:
    assert loop_claims.claim(engine, "loop-a", "owner-1", min_interval_ms=0, ttl_ms=LONG_MS)
    loop_claims.release(engine, "loop-a", "intruder")
    assert loop_claims.claim(engine, "loop-a", "owner-2", min_interval_ms=0, ttl_ms=LONG_MS) is False


def test_a_dead_holder_is_taken_over_once_its_deadline_passes(engine: Engine) -> None:
    assert loop_claims.claim(engine, "loop-a", "live", min_interval_ms=0, ttl_ms=LONG_MS)
    assert loop_claims.claim(engine, "loop-a", "other", min_interval_ms=0, ttl_ms=LONG_MS) is False
    loop_claims.release(engine, "loop-a", "live")
    # A pass that dies never releases; its claim carries a deadline (here: already passed).
    assert loop_claims.claim(engine, "loop-a", "dead", min_interval_ms=0, ttl_ms=0)
    assert loop_claims.claim(engine, "loop-a", "alive", min_interval_ms=0, ttl_ms=LONG_MS) is True
    with engine.connect() as conn:
        assert conn.execute(select(loop_runs.c.owner).where(loop_runs.c.name == "loop-a")).scalar() == "alive"
    # The dead pass cannot renew what it lost; the live one can.
    assert loop_claims.renew(engine, "loop-a", "dead", LONG_MS) is False
    assert loop_claims.renew(engine, "loop-a", "alive", LONG_MS) is True


def test_loops_do_not_share_claims(engine: Engine) -> None:
    assert loop_claims.claim(engine, "loop-a", "o", min_interval_ms=0, ttl_ms=LONG_MS)
    assert loop_claims.claim(engine, "loop-b", "o", min_interval_ms=0, ttl_ms=LONG_MS)


def _race_claims(engine: Engine, threads: int) -> list[bool]:
    barrier = threading.Barrier(threads)
    results: list[bool] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def racer(i: int) -> None:
        try:
            barrier.wait(10)
            ok = loop_claims.claim(engine, "loop-race", f"owner-{i}", min_interval_ms=LONG_MS, ttl_ms=LONG_MS)
            with lock:
                results.append(ok)
        except BaseException as exc:
            errors.append(exc)

    ts = [threading.Thread(target=racer, args=(i,)) for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert errors == []
    assert len(results) == threads
    return results


def test_concurrent_claims_on_postgres_exactly_one_wins_on_a_new_row(pg_engine: Engine) -> None:
    assert _race_claims(pg_engine, 8).count(True) == 1


def test_concurrent_claims_on_postgres_exactly_one_wins_on_an_existing_row(pg_engine: Engine) -> None:
    assert loop_claims.claim(pg_engine, "loop-race", "seed", min_interval_ms=0, ttl_ms=LONG_MS)
    loop_claims.release(pg_engine, "loop-race", "seed")
    with pg_engine.begin() as conn:  # make the last pass old enough for the interval guard
        conn.execute(
            loop_runs.update().values(
                started_at=loop_runs.c.started_at - _hours(1), finished_at=loop_runs.c.finished_at - _hours(1)
            )
        )
    assert _race_claims(pg_engine, 8).count(True) == 1


def _hours(n: int) -> Any:
    from datetime import timedelta

    return timedelta(hours=n)


# -- the loops themselves ---------------------------------------------------------------------------


@pytest.fixture
def runtime(engine: Engine, redis_url: str) -> Iterator[tuple[Runtime, Recorder, RecordingCallbacks]]:
    # Interval 0 => no spacing between passes, so each test controls exactly when a pass runs.
    settings = settings_for(
        redis_url,
        RECEIPT_RESONATE_QUEUED_REDRIVE_INTERVAL_MS="0",
        RECEIPT_LEASE_EXPIRY_INTERVAL_MS="0",
        RECEIPT_RESONATE_QUEUED_REDRIVE_MIN_AGE_MS="0",
        RECEIPT_RESONATE_QUEUED_REDRIVE_COOLDOWN_MS="0",
    )
    yield recording_runtime(engine, settings)


def tune(rt: Runtime, **changes: Any) -> None:
    rt.settings = dataclasses.replace(rt.settings, **changes)


def test_redrive_ignores_jobs_younger_than_the_minimum_age(runtime: Any) -> None:
    rt, sent, _ = runtime
    enqueue(rt.queue, "factory")
    sent.clear()
    tune(rt, queued_redrive_min_age_ms=LONG_MS)
    assert loop_passes.redrive_queued(rt)["redriven"] == []
    assert sent.sent == []


def worker_items(sent: Any) -> list[list[Any]]:
    """Every attempt the recorded worker messages carry: [job id, fence, dispatch key, generation]."""
    items = [t.args for t in sent.named(EXECUTE_TASK)]
    for t in sent.named(EXECUTE_BATCH_TASK):
        items += t.args[0]
    return items


def test_redrive_moves_the_line_of_a_job_whose_wake_up_was_lost(runtime: Any) -> None:
    rt, sent, _ = runtime
    job = enqueue(rt.queue, "factory")
    sent.clear()  # the enqueue's wake-up, lost
    assert loop_passes.redrive_queued(rt)["redriven"] == [job.id]
    [message] = sent.named(EXECUTE_TASK)
    # Under the spec's redrive key: one delivery per observed queue state.
    assert message.args == [job.id, f"{job.id}:attempt:1", f"{job.id}:redrive:{job.seq}:queued", 0]
    assert message.queue == route(job.agent_id, job.kind).queue
    assert len(sent.sent) == 1


def test_a_second_pass_sends_nothing_beside_a_delivery_in_flight(runtime: Any) -> None:
    rt, sent, _ = runtime
    enqueue(rt.queue, "factory")
    sent.clear()
    loop_passes.redrive_queued(rt)
    assert len(worker_items(sent)) == 1
    assert loop_passes.redrive_queued(rt)["redriven"] == []
    assert len(worker_items(sent)) == 1


def test_a_delivery_that_ended_is_sent_again_under_the_redrive_key_of_the_state_it_saw(runtime: Any) -> None:
    rt, sent, _ = runtime
    job = enqueue(rt.queue, "factory")
    dispatch_jobs(rt, [job.id])  # the enqueue wake-up's delivery, just now
    sent.clear()
    assert loop_passes.redrive_queued(rt)["redriven"] == []  # in flight: no second message beside it
    assert sent.sent == []
    with transaction(rt.engine) as conn:  # ... until it ends (here: as if its message were lost)
        settle_deliveries(conn, job.id, "lost", db_now(conn))
    assert loop_passes.redrive_queued(rt)["redriven"] == [job.id]
    assert [item[2:] for item in worker_items(sent)] == [[f"{job.id}:redrive:{job.seq}:queued", 0]]
    # The same state seen again: the same key, so once that delivery ends too, its next generation.
    with transaction(rt.engine) as conn:
        settle_deliveries(conn, job.id, "lost", db_now(conn))
    sent.clear()
    assert loop_passes.redrive_queued(rt)["redriven"] == [job.id]
    assert [item[2:] for item in worker_items(sent)] == [[f"{job.id}:redrive:{job.seq}:queued", 1]]


def test_redrive_skips_jobs_that_are_not_queued(runtime: Any) -> None:
    rt, sent, _ = runtime
    job = enqueue(rt.queue, "factory")
    assert lease(rt.queue, job.id, "w", LONG_MS).applied
    sent.clear()
    assert loop_passes.redrive_queued(rt)["redriven"] == []
    assert sent.sent == []


def test_a_loop_held_elsewhere_is_skipped(runtime: Any) -> None:
    rt, sent, _ = runtime
    enqueue(rt.queue, "factory")
    sent.clear()
    tune(rt, queued_redrive_interval_ms=LONG_MS)
    assert loop_claims.claim(
        rt.engine, loop_passes.REDRIVE_LOOP, "other-beat", min_interval_ms=0, ttl_ms=LONG_MS
    )
    assert loop_passes.redrive_queued(rt) == {"skipped": True}
    assert sent.sent == []


def test_two_redrive_passes_at_once_deliver_each_job_once_on_postgres(
    pg_engine: Engine,
    redis_url: str,
) -> None:
    """Two beats by mistake: two passes race over the same line; each job gets one message."""
    settings = settings_for(
        redis_url,
        RECEIPT_RESONATE_QUEUED_REDRIVE_INTERVAL_MS="60000",
        RECEIPT_RESONATE_QUEUED_REDRIVE_MIN_AGE_MS="0",
        RECEIPT_RESONATE_QUEUED_REDRIVE_COOLDOWN_MS="0",
    )
    rt, sent, _ = recording_runtime(pg_engine, settings)
    ids = {enqueue(rt.queue, "factory").id for _ in range(5)}
    sent.clear()
    barrier = threading.Barrier(2)
    outcomes: list[dict[str, Any]] = []

    def beat() -> None:
        barrier.wait(10)
        outcomes.append(loop_passes.redrive_queued(rt))

    ts = [threading.Thread(target=beat) for _ in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    assert len(outcomes) == 2
    assert sorted(item[0] for item in worker_items(sent)) == sorted(ids)
    with pg_engine.connect() as conn:
        assert conn.execute(select(deliveries.c.job_id)).scalars().all().__len__() == len(ids)


def test_expire_leases_appends_lease_expired_and_wakes_dispatch(runtime: Any) -> None:
    rt, sent, callbacks = runtime
    dead = enqueue(rt.queue, "factory")
    alive = enqueue(rt.queue, "factory")
    assert lease(rt.queue, dead.id, "dead-worker", 1).applied
    assert lease(rt.queue, alive.id, "live-worker", LONG_MS).applied
    wait_lease_past_deadline(rt.engine, rt.queue, dead.id)
    sent.clear()
    assert loop_passes.expire_leases(rt) == {"expired": [dead.id]}
    assert types_of(rt.engine, dead.id)[-1] == "job.lease_expired"
    assert "job.lease_expired" not in types_of(rt.engine, alive.id)
    requeued = rt.queue.get(dead.id)
    assert requeued is not None and (requeued.status, requeued.attempt) == ("queued", 1)
    # The requeued job goes back through the one delivery path: a dispatch wake-up naming it.
    [wake] = sent.named(DISPATCH_TASK)
    assert wake.args == [[dead.id]]
    assert wake.queue == DRIVER_QUEUE
    assert callbacks.events() == []
    # Idempotent: a second pass finds nothing to expire.
    sent.clear()
    assert loop_passes.expire_leases(rt) == {"expired": []}
    assert sent.sent == []


def test_expiring_the_last_attempt_fails_the_job_and_posts_the_callback(runtime: Any) -> None:
    rt, sent, callbacks = runtime
    job = enqueue(rt.queue, "factory", max_attempts=1)
    assert lease(rt.queue, job.id, "dead-worker", 1).applied
    wait_lease_past_deadline(rt.engine, rt.queue, job.id)
    sent.clear()
    assert loop_passes.expire_leases(rt) == {"expired": [job.id]}
    failed = rt.queue.get(job.id)
    assert failed is not None and failed.status == "failed"
    assert failed.result == {"status": "lease_lost"}
    assert callbacks.events() == ["failed"]
    # Nothing to redeliver; the wake-up names only the queue whose place it freed.
    assert [t.args for t in sent.named(DISPATCH_TASK)] == [[[f"@{route(job.agent_id, job.kind).queue}"]]]


def test_with_tracing_on_the_lease_expiry_pass_is_a_span_linked_to_the_job_it_expired(
    spans: Spans, runtime: Any
) -> None:
    rt, _sent, _callbacks = runtime
    dead = enqueue(rt.queue, "factory")
    assert dead.trace_context is not None
    assert lease(rt.queue, dead.id, "dead-worker", 1).applied
    wait_lease_past_deadline(rt.engine, rt.queue, dead.id)
    assert loop_passes.expire_leases(rt) == {"expired": [dead.id]}
    span = spans.one("receipt.loop lease-expiry")
    assert [f"{link.context.trace_id:032x}" for link in span.links] == [
        dead.trace_context["traceparent"][3:35]
    ]
    # A pass that finds nothing makes no span.
    assert loop_passes.expire_leases(rt) == {"expired": []}
    assert len(spans.named("receipt.loop lease-expiry")) == 1
