"""Delivery records — the driver starter's "promises" — on every backend (spec: "Driver RPC")."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine

from app.jobs.errors import (
    ACTIVE_DELIVERY_REASON,
    MAX_DELIVERY_GENERATIONS,
    DeliveryGenerationsExceeded,
    generations_exceeded_message,
)
from app.jobs.vocab import DeliveryOutcome
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
) -> delivery.StartDecision:
    with transaction(engine) as conn:
        now = db_now(conn) + timedelta(milliseconds=skew_ms)
        return delivery.begin(conn, job_id, key, now, timeout_ms)


def settle(engine: Engine, key: str, generation: int, outcome: DeliveryOutcome = "dispatched") -> None:
    with transaction(engine) as conn:
        delivery.settle(conn, key, generation, outcome, db_now(conn))


def rows(engine: Engine, key: str = "job-1") -> list[tuple[int, str, str | None, str]]:
    with engine.connect() as conn:
        return [
            (r.generation, r.state, r.outcome, r.task_id)
            for r in conn.execute(
                select(deliveries).where(deliveries.c.dispatch_key == key).order_by(deliveries.c.generation)
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
    # A generous deadline, so a loaded machine's own delay never crosses it by accident.
    begin(engine, timeout_ms=60_000)
    assert begin(engine, skew_ms=10).created is False  # within the deadline
    later = begin(engine, skew_ms=61_000)
    assert (later.created, later.generation) == (True, 1)
    # The expired generation is never marked settled by this: it is just no longer pending.
    assert [r[:2] for r in rows(engine)] == [(0, "pending"), (1, "pending")]


def test_keys_are_independent(engine: Engine) -> None:
    begin(engine, "job-1")
    d = begin(engine, "job-1:redrive:1:queued")
    assert (d.created, d.generation) == (True, 0)
    with engine.connect() as conn:
        assert has_active(conn, "job-1", db_now(conn))
        assert delivery.last_started_at(conn, "job-1") is not None
        assert delivery.last_started_at(conn, "job-2") is None


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
