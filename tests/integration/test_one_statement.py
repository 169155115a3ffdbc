"""A job's transition as one autocommitted statement (app/storage/queue.py ``_mutate``).

On PostgreSQL a single-job transition -- its receipts, its projection row and the settlement of
its deliveries -- is one statement on an autocommit connection: no BEGIN and COMMIT round trips.
It must stay exactly as atomic as the transaction it replaces, and fall back to a transaction
whenever the transition must write more (callback outbox rows, an objective's control request).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.jobs.ids import qualify
from app.jobs.validation import validate_enqueue
from app.storage import delivery, store
from app.storage.db import callback_outbox, db_now, deliveries, transaction

BODY = {"payload": {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": "o"}}}


def pending_delivery(engine: Engine, job_id: str) -> None:
    with transaction(engine) as conn:
        [decision] = delivery.begin_many(conn, [delivery.StartRequest(job_id, job_id, 60_000)], db_now(conn))
        assert isinstance(decision, delivery.StartDecision) and decision.created


def delivery_states(engine: Engine, job_id: str) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(deliveries.c.state, deliveries.c.outcome).where(deliveries.c.job_id == job_id)
        )
        return [tuple(r) for r in rows]


def test_a_worker_attempt_opens_no_transaction_and_stays_whole(
    pg_engine: Engine, transactions: list[str]
) -> None:
    queue = queue_for(pg_engine)
    job = queue.enqueue(validate_enqueue("factory", BODY)).job
    pending_delivery(pg_engine, job.id)
    transactions.clear()
    assert queue.start_attempt(job.id, "w", 1, lambda _job: 60_000).status == "started"
    assert queue.heartbeat(job.id, "w", 1, 60_000).applied
    done = queue.settle_attempt(job.id, "w", 1, result={"ok": True})
    assert done.applied and done.job.status == "completed"
    assert transactions == []
    # The settlement ended the pending delivery in its own statement.
    assert delivery_states(pg_engine, job.id) == [("settled", "completed")]
    with pg_engine.connect() as conn:
        types = [r.type for r in store.read_stream(conn, f"jobs/{job.id}")]
        assert store.verify(conn, stream=f"jobs/{job.id}") == (len(types), None)
    assert types == ["job.enqueued", "job.leased", "job.heartbeat", "job.heartbeat", "job.completed"]
    assert queue.get(job.id) == done.job  # the projection row is the fold


def test_a_plain_enqueue_is_one_statement_and_a_singleton_keeps_its_transaction(
    pg_engine: Engine, transactions: list[str]
) -> None:
    queue = queue_for(pg_engine)
    first = queue.enqueue(validate_enqueue("factory", {**BODY, "jobId": "os-1"}))
    again = queue.enqueue(validate_enqueue("factory", {**BODY, "jobId": "os-1"}))
    assert (first.created, again.created, again.job.id) == (True, False, qualify("o", "os-1"))
    assert transactions == []
    queue.enqueue(validate_enqueue("factory", {**BODY, "sessionKey": "s", "singletonMode": "cancel"}))
    assert transactions == ["tx"]  # the session lock needs a transaction


def test_a_transition_with_callbacks_falls_back_to_a_transaction(
    pg_engine: Engine, transactions: list[str]
) -> None:
    queue = queue_for(pg_engine, callback_targets=["http://127.0.0.1:9/hook"])
    job = queue.enqueue(validate_enqueue("factory", BODY)).job
    assert queue.start_attempt(job.id, "w", 1, lambda _job: 60_000).status == "started"
    assert transactions == []
    assert queue.settle_attempt(job.id, "w", 1, result=None).job.status == "completed"
    assert transactions == ["tx"]  # the terminal receipt writes its outbox row beside it
    with pg_engine.connect() as conn:
        events = conn.execute(select(callback_outbox.c.event_id)).all()
    assert len(events) == 1
    # (An objective's control request falls back the same way: tests/integration/test_factory.py
    # drives objectives end to end on this path.)


def test_a_losing_writer_rereads_and_decides_again(pg_engine: Engine) -> None:
    """Two settlements of one attempt race: one applies, the other re-reads and finds the job
    terminal (no second terminal receipt)."""
    queue = queue_for(pg_engine)
    job = queue.enqueue(validate_enqueue("factory", BODY)).job
    assert queue.start_attempt(job.id, "w", 1, lambda _job: 60_000).status == "started"
    first = queue.settle_attempt(job.id, "w", 1, result=1)
    second = queue.settle_attempt(job.id, "w", 1, result=2)
    assert (first.applied, second.applied) == (True, False)
    with pg_engine.connect() as conn:
        terminal = [r for r in store.read_stream(conn, f"jobs/{job.id}") if r.type == "job.completed"]
    assert len(terminal) == 1 and terminal[0].body["result"] == 1
