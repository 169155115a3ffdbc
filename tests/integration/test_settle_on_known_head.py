"""A worker settles an attempt on the head its lease wrote (``Queue.settle_attempt(known=...)``):
one statement and no read of the row, stamped with the database clock its lease read advanced by
the process's monotonic clock; a head that moved since is decided again on a fresh read."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.storage import db, projection, store
from app.storage.db import parse_iso
from app.storage.queue import AttemptStart, ClockReading, Known, Queue
from tests.support.spies import counting

from .runtime_support import enqueue

LEASE_MS = 60_000


def leased(queue: Queue, n: int = 2) -> list[AttemptStart]:
    jobs = [enqueue(queue, "factory") for _ in range(n)]
    starts = queue.start_attempts([(job.id, f"w-{i}", 1) for i, job in enumerate(jobs)], lambda _j: LEASE_MS)
    assert all(isinstance(s, AttemptStart) and s.status == "started" for s in starts)
    return starts  # type: ignore[return-value]


def test_a_lease_answers_with_the_head_it_wrote_and_the_clock_it_read(pg_engine: Engine) -> None:
    queue = queue_for(pg_engine)
    for start in leased(queue):
        assert start.known is not None and start.job is not None
        assert start.known.head.job == start.job == queue.get(start.job.id)
        # The lease's receipt was stamped with that clock: the known clock starts there.
        lease_at = parse_iso(start.job.updated_at)
        assert lease_at is not None and start.known.clock.at == lease_at
        assert start.known.now() >= start.known.clock.at


def test_a_single_messages_lease_answers_with_its_head_and_its_settlement_reads_nothing(
    pg_engine: Engine, reads: dict[str, int]
) -> None:
    """A ``receipt.execute`` message's attempt (``Queue.start_attempt``, one job) settles as a
    batch's does: on the head its lease wrote."""
    queue = queue_for(pg_engine, ledger_in_background=True)
    job = enqueue(queue, "factory")
    start = queue.start_attempt(job.id, "w-1", 1, lambda _j: LEASE_MS)
    assert start.status == "started" and start.job is not None and start.known is not None
    assert start.known.head.job == start.job == queue.get(job.id)
    assert start.known.clock.at == parse_iso(start.job.updated_at)
    reads.update(reads=0, transactions=0)
    out = queue.settle_attempt(job.id, "w-1", 1, result={"ok": True}, known=start.known)
    assert out.applied and out.job.status == "completed"
    assert reads == {"reads": 0, "transactions": 0}


def test_a_known_clock_advances_with_the_monotonic_clock_and_never_goes_back() -> None:
    at = datetime(2030, 1, 1, tzinfo=UTC)
    head = projection.Loaded(None, "h", at)  # type: ignore[arg-type]
    known = Known(head, ClockReading(at, time.monotonic() - 2.0))
    assert timedelta(seconds=2) <= known.now() - at < timedelta(seconds=3)
    ahead = Known(head, ClockReading(at, time.monotonic() + 5.0))  # a reading from the future: clamped
    assert ahead.now() == at


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    """How often the queue reads a job's row and opens a transaction. (A cursor listener would
    turn the one-statement path off: ``Direct.available``.)"""
    seen = {"reads": 0, "transactions": 0}

    for loader in ("load", "load_at_clock", "load_many_at_clock"):
        monkeypatch.setattr(projection, loader, counting(seen, "reads", getattr(projection, loader)))
    monkeypatch.setattr("app.storage.queue.transaction", counting(seen, "transactions", db.transaction))
    return seen


def test_the_settlement_on_a_known_head_is_one_statement_with_no_read(
    pg_engine: Engine, reads: dict[str, int]
) -> None:
    # As every long-lived process composes it: the ledger's rows are written off the transition.
    queue = queue_for(pg_engine, ledger_in_background=True)
    first, _second = leased(queue)
    assert first.job is not None
    reads.update(reads=0, transactions=0)
    out = queue.settle_attempt(first.job.id, "w-0", 1, result={"ok": True}, known=first.known)
    assert out.applied and out.job.status == "completed"
    assert reads == {"reads": 0, "transactions": 0}  # one autocommitted statement
    assert queue.get(first.job.id) == out.job
    assert parse_iso(out.job.updated_at) >= parse_iso(first.job.updated_at)  # type: ignore[operator]
    with queue.engine.connect() as conn:
        checked, broken = store.verify(conn)
    assert broken is None and checked > 0


def test_a_head_that_moved_since_the_lease_is_decided_again_on_a_fresh_read(
    pg_engine: Engine, reads: dict[str, int]
) -> None:
    queue = queue_for(pg_engine, ledger_in_background=True)
    first, _second = leased(queue)
    assert first.job is not None
    queue.cancel(first.job.id, "stop")  # an abort request appended after the lease
    reads.update(reads=0, transactions=0)
    out = queue.settle_attempt(first.job.id, "w-0", 1, result={"ok": True}, known=first.known)
    # Decided on what the abort appended, exactly as without a known head: the pending abort
    # cancels the job whatever the attempt returned.
    assert out.job == queue_for(pg_engine).get(first.job.id)
    assert out.job.status == "canceled"
    assert reads["reads"] >= 1, "the moved head was read again"
    with queue.engine.connect() as conn:
        assert store.verify(conn)[1] is None


def test_a_settlement_a_hook_writes_beside_takes_a_transaction_but_still_no_read(
    pg_engine: Engine, reads: dict[str, int]
) -> None:
    # A callback target: a terminal settlement writes its outbox row in its own transaction.
    queue = queue_for(
        pg_engine, ledger_in_background=True, callback_targets=("http://callbacks.invalid/hook",)
    )
    first, _second = leased(queue)
    assert first.job is not None
    reads.update(reads=0, transactions=0)
    out = queue.settle_attempt(first.job.id, "w-0", 1, result={"ok": True}, known=first.known)
    assert out.applied and out.job.status == "completed"
    assert reads == {"reads": 0, "transactions": 1}
    assert queue.get(first.job.id) == out.job
