"""A message's transitions are one write: ``Queue.mutate_many`` writes the transitions that carry
nothing beside their receipts (a batch's leases): on PostgreSQL, with no lock to take, one read and
one statement with no transaction around them (``projection.advance_unlocked``: each row where it was
read and the receipts of only those), and a job that moved meanwhile is decided again; in a
transaction, two statements whatever their number (``projection.advance_many``). One that a hook
writes beside (a settlement's deliveries, a callback's outbox row) keeps its own statement, in the
same transaction. Every job still gets its own hash-chained receipts and its own fence."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from sqlalchemy import event
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.jobs import transitions
from app.storage import projection, store
from app.storage.queue import Outcome, Queue

from .runtime_support import enqueue

LEASE_MS = 60_000


@pytest.fixture
def statements(pg_engine: Engine) -> Iterator[list[str]]:
    """Every statement sent to PostgreSQL (a listener turns the driver's-cursor path off). SQLite,
    one writer in-process, writes a page row by row."""
    engine = pg_engine
    seen: list[str] = []

    def listen(_c: Any, _cur: Any, statement: str, *_: Any) -> None:
        seen.append(" ".join(statement.split()))

    event.listen(engine, "before_cursor_execute", listen)
    yield seen
    event.remove(engine, "before_cursor_execute", listen)


def test_a_batchs_leases_are_one_read_and_one_write_with_no_transaction(
    pg_engine: Engine, statements: list[str]
) -> None:
    queue = queue_for(pg_engine)
    jobs = [enqueue(queue, "factory") for _ in range(4)]
    statements.clear()
    starts = queue.start_attempts(
        [(job.id, f"w-{i}", 1) for i, job in enumerate(jobs)], lambda _job: LEASE_MS
    )
    assert [s.status for s in starts] == ["started"] * 4  # type: ignore[union-attr]
    assert [s.job.lease.worker_id for s in starts] == [f"w-{i}" for i in range(4)]  # type: ignore[union-attr]
    # Every row where it was read and every receipt, in one statement after one read.
    [write] = [s for s in statements if "UPDATE jobs" in s or "INSERT INTO receipts" in s]
    assert write.startswith("WITH moved AS (UPDATE jobs") and "INSERT INTO receipts" in write
    assert sum(s.startswith("SELECT clock_timestamp() AS now, jobs.state") for s in statements) == 1
    with queue.engine.connect() as conn:
        checked, broken = store.verify(conn)
    assert broken is None and checked > 0
    for i, job in enumerate(jobs):
        after = queue.get(job.id)
        assert (
            after is not None
            and after.status in ("leased", "running")
            and after.lease is not None
            and after.lease.worker_id == f"w-{i}"
        )


def test_a_job_that_moved_after_the_read_gets_nothing_and_is_decided_again(
    pg_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    queue = queue_for(pg_engine)
    jobs = [enqueue(queue, "factory") for _ in range(3)]
    real = projection.load_many_at_clock
    calls = []

    def read_then_cancel(conn: Any, job_ids: Any) -> Any:
        out = real(conn, job_ids)
        calls.append(list(job_ids))
        if len(calls) == 1:  # another writer cancels the second job between the read and the write
            queue_for(pg_engine).cancel(jobs[1].id, "meanwhile")
        return out

    monkeypatch.setattr(projection, "load_many_at_clock", read_then_cancel)
    starts = queue.start_attempts([(job.id, f"w-{i}", 1) for i, job in enumerate(jobs)], lambda _j: LEASE_MS)
    assert [s.status for s in starts] == ["started", "terminal_state", "started"]  # type: ignore[union-attr]
    assert calls[1] == [jobs[1].id], "only the job that moved was read again"
    moved = queue.get(jobs[1].id)
    assert moved is not None and moved.status == "canceled" and moved.lease is None
    with queue.engine.connect() as conn:
        assert store.verify(conn)[1] is None


def test_a_job_named_twice_is_decided_the_second_time_on_what_the_first_appended(queue: Queue) -> None:
    job = enqueue(queue, "factory")
    other = enqueue(queue, "factory")
    answers = queue.mutate_many(
        [
            (job.id, lambda j, now: transitions.start_attempt(j, now, "w-1", 1, LEASE_MS).events),
            (other.id, lambda j, now: transitions.start_attempt(j, now, "w-2", 1, LEASE_MS).events),
            (job.id, lambda j, now: transitions.heartbeat_holder(j, now, "w-1", 1, LEASE_MS)),
        ]
    )
    first, second, beat = answers
    assert isinstance(first, Outcome) and isinstance(second, Outcome) and isinstance(beat, Outcome)
    assert beat.applied and beat.job.seq > first.job.seq
    assert queue.get(job.id) == beat.job
    with queue.engine.connect() as conn:
        assert store.verify(conn)[1] is None


def test_a_transition_a_hook_writes_beside_keeps_its_own_statement_in_the_same_commit(queue: Queue) -> None:
    leased = enqueue(queue, "factory")
    plain = enqueue(queue, "factory")
    [start] = queue.start_attempts([(leased.id, "w-1", 1)], lambda _job: LEASE_MS)
    answers = queue.mutate_many(
        [
            # A settlement settles the job's deliveries in its own statement (its companion).
            (leased.id, lambda j, now: transitions.settle_holder(j, now, "w-1", 1, result={"ok": True})),
            (plain.id, lambda j, now: transitions.start_attempt(j, now, "w-2", 1, LEASE_MS).events),
        ]
    )
    assert [a.job.status for a in answers if isinstance(a, Outcome)] == ["completed", "running"]
    assert queue.get(leased.id).status == "completed"  # type: ignore[union-attr]
    assert start is not None


def test_a_payload_integer_beyond_64_bits_survives_the_json_columns_exactly(queue: Queue) -> None:
    """The state and the receipts are JSON columns (app/storage/jsontext.py): the fold and the
    chain need every value exact."""
    job = enqueue(queue, "factory", huge=2**70)
    [start] = queue.start_attempts([(job.id, "w-1", 1)], lambda _job: LEASE_MS)
    read = queue.get(job.id)
    assert read is not None and read.payload["huge"] == 2**70 and isinstance(read.payload["huge"], int)
    assert start.job.payload["huge"] == 2**70  # type: ignore[union-attr]
    with queue.engine.connect() as conn:
        assert store.verify(conn)[1] is None
