"""Delivery records — the driver starter's "promises" — on every backend (spec: "Driver RPC")."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.jobs.errors import (
    ACTIVE_DELIVERY_REASON,
    MAX_DELIVERY_GENERATIONS,
    DeliveryGenerationsExceeded,
    generations_exceeded_message,
)
from app.storage import delivery
from app.storage.db import db_now, deliveries, transaction
from tests.support.queue_ops import has_active

DRIVER_TIMEOUT_MS = 120_000


def begin(
    engine: Engine,
    key: str = "job-1",
    *,
    job_id: str = "job-1",
    timeout_ms: int = DRIVER_TIMEOUT_MS,
    skew_ms: int = 0,
    epoch: str | None = None,
    presume_lost: bool = False,
) -> delivery.StartDecision:
    with transaction(engine) as conn:
        now = db_now(conn) + timedelta(milliseconds=skew_ms)
        before = now if presume_lost else None
        return delivery.begin(conn, job_id, key, now, timeout_ms, epoch=epoch, presume_lost_before=before)


def settle(
    engine: Engine, key: str, generation: int, outcome: str = "completed", *, job_id: str = "job-1"
) -> None:
    with transaction(engine) as conn:
        delivery.settle(conn, job_id, key, generation, outcome, db_now(conn))


def rows(engine: Engine, key: str = "job-1", job_id: str = "job-1") -> list[tuple[int, str, str | None, str]]:
    with engine.connect() as conn:
        return [
            (r.generation, r.state, r.outcome, r.task_id)
            for r in conn.execute(
                select(deliveries)
                .where(deliveries.c.job_id == job_id, deliveries.c.dispatch_key == key)
                .order_by(deliveries.c.generation)
            )
        ]


def test_first_begin_creates_generation_zero(engine: Engine) -> None:
    d = begin(engine)
    assert (d.created, d.generation, d.task_id) == (True, 0, "job-1:driver:0")
    assert rows(engine) == [(0, "pending", None, "job-1:driver:0")]


def test_begin_while_pending_is_active_delivery_and_writes_nothing(engine: Engine) -> None:
    begin(engine)
    again = begin(engine)
    assert (again.created, again.reason, again.generation) == (False, ACTIVE_DELIVERY_REASON, 0)
    assert len(rows(engine)) == 1


def test_after_settle_the_next_begin_is_generation_one(engine: Engine) -> None:
    begin(engine)
    settle(engine, "job-1", 0, "dispatched")
    d = begin(engine)
    assert (d.created, d.generation, d.task_id) == (True, 1, "job-1:driver:1")
    assert rows(engine) == [
        (0, "settled", "dispatched", "job-1:driver:0"),
        (1, "pending", None, "job-1:driver:1"),
    ]


def test_settle_is_idempotent_first_outcome_wins(engine: Engine) -> None:
    begin(engine)
    settle(engine, "job-1", 0, "dispatched")
    settle(engine, "job-1", 0, "send_failed")
    assert rows(engine)[0][2] == "dispatched"


def test_a_delivery_past_its_deadline_no_longer_blocks(engine: Engine) -> None:
    """The driver invocation timeout bounds how long a delivery counts as pending."""
    # A minute's deadline and clocks skewed forward, so a slow machine cannot blur the two sides.
    begin(engine, timeout_ms=60_000)
    assert begin(engine, skew_ms=10).created is False  # within the deadline
    later = begin(engine, skew_ms=120_000)
    assert (later.created, later.generation) == (True, 1)
    # The expired generation is ended on the way: no record stays pending once it cannot matter.
    assert [r[:3] for r in rows(engine)] == [(0, "settled", "expired"), (1, "pending", None)]


def test_a_redrive_sends_nothing_beside_a_live_delivery_of_another_key(engine: Engine) -> None:
    """Redrive does not send a message for a job with a live delivery in flight."""
    begin(engine, "job-1")
    d = begin(engine, "job-1:redrive:1:queued")
    assert (d.created, d.reason) == (False, ACTIVE_DELIVERY_REASON)
    assert rows(engine, "job-1:redrive:1:queued") == []
    settle(engine, "job-1", 0)
    d = begin(engine, "job-1:redrive:1:queued")
    assert (d.created, d.generation) == (True, 0)  # keys keep their own generations
    with engine.connect() as conn:
        assert has_active(conn, "job-1", db_now(conn))
        assert delivery.last_started_at(conn, "job-1") is not None
        assert delivery.last_started_at(conn, "job-2") is None


def test_a_delivery_sent_to_an_earlier_broker_epoch_is_superseded_at_once(engine: Engine) -> None:
    """After a broker restart or flush, the pending delivery is known lost."""
    begin(engine, epoch="epoch-a")
    assert begin(engine, epoch="epoch-a").created is False
    d = begin(engine, epoch="epoch-b")
    assert (d.created, d.generation) == (True, 1)
    assert [r[:3] for r in rows(engine)] == [(0, "settled", "broker_lost"), (1, "pending", None)]
    # An unknown epoch (broker unreachable) supersedes nothing.
    assert begin(engine, epoch=None).created is False
    with engine.connect() as conn:
        # The lost delivery no longer counts for the redrive cooldown under the new epoch.
        newest = delivery.last_started_at(conn, "job-1", "epoch-c")
        assert newest is None


def test_presume_lost_ends_every_pending_delivery_of_the_job_older_than_the_bound(engine: Engine) -> None:
    begin(engine, "job-1")
    with transaction(engine) as conn:  # a bound before the delivery was recorded: it is left alone
        early = db_now(conn) - timedelta(minutes=1)
        d = delivery.begin(
            conn, "job-1", "job-1:redrive:1:queued", db_now(conn), 60_000, presume_lost_before=early
        )
    assert (d.created, d.reason) == (False, ACTIVE_DELIVERY_REASON)
    d = begin(engine, "job-1:redrive:1:queued", presume_lost=True, skew_ms=10)
    assert (d.created, d.generation) == (True, 0)
    assert rows(engine)[0][:3] == (0, "settled", "presumed_lost")


def test_a_job_id_equal_to_another_jobs_redrive_key_does_not_collide(engine: Engine) -> None:
    """A client jobId may contain ':'; keys are structured, so no collision."""
    victim, squatter = "x", "x:redrive:1:queued"
    d = begin(engine, squatter, job_id=squatter)  # the squatter's own (base) delivery, pending
    assert d.created
    redrive = begin(engine, delivery.redrive_key(victim, 1, "queued"), job_id=victim)
    assert (redrive.created, redrive.generation) == (True, 0)
    settle(engine, squatter, 0, "completed", job_id=victim)  # settling the victim's key ...
    assert rows(engine, squatter, job_id=squatter)[0][1] == "pending"  # ... leaves the squatter's alone
    assert rows(engine, squatter, job_id=victim)[0][1] == "settled"
    assert delivery.DeliveryKey.of(squatter, squatter) == delivery.DeliveryKey(squatter, "dispatch")
    assert delivery.DeliveryKey.of(victim, squatter) == delivery.DeliveryKey(victim, "redrive", "1:queued")
    with pytest.raises(ValueError):
        delivery.DeliveryKey.of("y", squatter)


def test_sweep_ends_expired_deliveries_and_those_of_terminal_jobs(engine: Engine) -> None:
    from app.jobs.validation import validate_enqueue

    q = queue_for(engine)
    req = validate_enqueue(
        "factory", {"payload": {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": "o"}}}
    )
    job = q.enqueue(req).job
    begin(engine, job.id, job_id=job.id)
    begin(engine, "job-1", timeout_ms=1)
    with transaction(engine) as conn:
        later = db_now(conn) + timedelta(milliseconds=5)
        assert delivery.sweep(conn, later) == 1  # only the expired one: job is still queued
    q.cancel(job.id, "test")  # the cancel itself ends the job's pending deliveries in its transaction
    assert rows(engine, job.id, job_id=job.id)[0][1:3] == ("settled", "canceled")
    with engine.begin() as conn:  # a record some other path left pending for the now-terminal job
        conn.execute(
            deliveries.update().where(deliveries.c.job_id == job.id).values(state="pending", outcome=None)
        )
    with transaction(engine) as conn:
        assert delivery.sweep(conn, db_now(conn)) == 1
    assert rows(engine, job.id, job_id=job.id)[0][1:3] == ("settled", "job_terminal")
    with engine.connect() as conn:
        assert conn.execute(select(deliveries).where(deliveries.c.state == "pending")).all() == []


def test_generations_are_bounded_at_32(engine: Engine) -> None:
    for generation in range(MAX_DELIVERY_GENERATIONS):
        d = begin(engine)
        assert (d.created, d.generation) == (True, generation)
        settle(engine, "job-1", generation)
    with pytest.raises(DeliveryGenerationsExceeded) as info:
        begin(engine)
    assert (
        str(info.value)
        == generations_exceeded_message("job-1")
        == "resonate delivery recovery exceeded 32 generations for job-1"
    )
    assert len(rows(engine)) == MAX_DELIVERY_GENERATIONS


@pytest.mark.parametrize("settled_first", [False, True], ids=["fresh-key", "after-terminal"])
def test_concurrent_begins_on_postgres_create_exactly_one(pg_engine: Engine, settled_first: bool) -> None:
    if settled_first:
        begin(pg_engine)
        settle(pg_engine, "job-1", 0)
    threads = 8
    barrier = threading.Barrier(threads)
    decisions: list[delivery.StartDecision] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def racer() -> None:
        try:
            barrier.wait(10)
            d = begin(pg_engine)
            with lock:
                decisions.append(d)
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=racer) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(30)
    assert errors == []
    assert len(decisions) == threads
    created = [d for d in decisions if d.created]
    assert len(created) == 1
    assert {d.reason for d in decisions if not d.created} == {ACTIVE_DELIVERY_REASON}
    expected_generation = 1 if settled_first else 0
    assert created[0].generation == expected_generation
    assert [r[:2] for r in rows(pg_engine)][-1] == (expected_generation, "pending")


def test_an_outbox_key_is_its_own_purpose(engine: Engine) -> None:
    """The objective outbox redrive delivers a stuck control job under ``<jobId>:outbox:<seq>``."""
    first = begin(engine, "job-1:outbox:3")
    assert (first.created, first.generation) == (True, 0)
    assert delivery.DeliveryKey.of("job-1", "job-1:outbox:3") == delivery.DeliveryKey("job-1", "outbox", "3")
    assert delivery.DeliveryKey("job-1", "outbox", "3").text == "job-1:outbox:3"


def test_a_batch_records_first_deliveries_without_reading_and_reads_only_the_others(
    pg_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: a job with no delivery record gets generation 0 from one statement with no read
    (the first-delivery rule); only jobs with records are read and decided by the full rule."""
    begin(pg_engine, "settled", job_id="settled")
    with transaction(pg_engine) as conn:
        delivery.settle(conn, "settled", "settled", 0, "completed", db_now(conn))
    begin(pg_engine, "pending", job_id="pending")
    read: list[list[str]] = []
    real = delivery._records_of

    def spy(conn: object, job_ids: list[str]) -> object:
        read.append(list(job_ids))
        return real(conn, job_ids)  # type: ignore[arg-type]

    monkeypatch.setattr(delivery, "_records_of", spy)
    requests = [
        delivery.StartRequest(job_id, job_id, DRIVER_TIMEOUT_MS)
        for job_id in ("a", "settled", "b", "pending")
    ]
    with transaction(pg_engine) as conn:
        decisions = delivery.begin_many(conn, requests, db_now(conn))
    assert read == [["pending", "settled"]]
    assert [(d.created, d.generation) for d in decisions] == [(True, 0), (True, 1), (True, 0), (False, 0)]  # type: ignore[union-attr]
    assert decisions[3].reason == ACTIVE_DELIVERY_REASON  # type: ignore[union-attr]
    with pg_engine.connect() as conn:
        rows = conn.execute(
            select(deliveries.c.job_id, deliveries.c.generation, deliveries.c.task_id, deliveries.c.state)
            .where(deliveries.c.job_id.in_(["a", "b"]))
            .order_by(deliveries.c.job_id)
        ).all()
    assert [tuple(r) for r in rows] == [
        ("a", 0, delivery.driver_task_id("a", 0), "pending"),
        ("b", 0, delivery.driver_task_id("b", 0), "pending"),
    ]
