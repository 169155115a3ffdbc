"""Group commit on a real database: ``Queue.mutate_many`` (several jobs' transitions, one transaction)
and ``GroupCommit`` (a worker's concurrent transitions queued behind a commit share the next one).
The coordination alone is tests/unit/test_group_commit.py."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from app.composition import queue_for
from app.jobs import transitions
from app.jobs.errors import JobNotFound
from app.jobs.reducer import fold
from app.jobs.validation import validate_enqueue
from app.storage import delivery, projection, store
from app.storage.db import db_now, deliveries, transaction
from app.storage.group_commit import GroupCommit
from app.storage.hooks import Change, Hook, Write
from app.storage.queue import Decide, Outcome, Queue
from tests.support.waiting import wait_for

BODY = {"payload": {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": "o"}}}
WAIT_S = 20


def leased(queue: Queue, engine: Engine, n: int) -> list[str]:
    """``n`` jobs, each leased to attempt 1 of worker ``w`` with a pending delivery."""
    ids = []
    for _ in range(n):
        job = queue.enqueue(validate_enqueue("factory", BODY)).job
        with transaction(engine) as conn:
            delivery.begin_many(conn, [delivery.StartRequest(job.id, job.id, 60_000)], db_now(conn))
        assert queue.start_attempt(job.id, "w", 1, lambda _job: 60_000).status == "started"
        ids.append(job.id)
    return ids


def settle(result: Any) -> Decide:
    return lambda job, now: transitions.settle_holder(job, now, "w", 1, result=result)


def heartbeat(job: Any, now: Any) -> Sequence[transitions.Event]:
    return transitions.heartbeat_holder(job, now, "w", 1, 60_000)


def types_of(engine: Engine, job_id: str) -> list[str]:
    with engine.connect() as conn:
        receipts = store.read_stream(conn, f"jobs/{job_id}")
        assert store.verify(conn, stream=f"jobs/{job_id}") == (len(receipts), None)
        assert projection.load(conn, job_id).job == fold(r.to_receipt() for r in receipts)  # type: ignore[union-attr]
    return [r.type for r in receipts]


def delivery_outcomes(engine: Engine, job_id: str) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(select(deliveries.c.outcome).where(deliveries.c.job_id == job_id)).scalars())


def test_several_jobs_settle_in_one_transaction_each_on_its_own_chain(
    engine: Engine, transactions: list[str]
) -> None:
    queue = queue_for(engine)
    a, b, c = leased(queue, engine, 3)
    transactions.clear()
    answers = queue.mutate_many([(a, settle("A")), (b, settle("B")), (c, heartbeat)])
    assert transactions == ["tx"]
    assert [(o.job.status, o.applied) for o in answers if isinstance(o, Outcome)] == [
        ("completed", True),
        ("completed", True),
        ("running", True),
    ]
    assert queue.get(a).result == "A" and queue.get(b).result == "B"  # type: ignore[union-attr]
    assert types_of(engine, a)[-1] == "job.completed" and types_of(engine, c)[-1] == "job.heartbeat"
    # Each settlement ended its own delivery in the shared transaction; the heartbeat ended none.
    assert delivery_outcomes(engine, a) == ["completed"] and delivery_outcomes(engine, c) == [None]


def test_a_job_named_twice_is_decided_the_second_time_on_what_the_first_appended(engine: Engine) -> None:
    queue = queue_for(engine)
    [a] = leased(queue, engine, 1)
    first, second, third = queue.mutate_many([(a, heartbeat), (a, settle(1)), (a, settle(2))])
    assert isinstance(first, Outcome) and first.applied
    assert isinstance(second, Outcome) and second.applied and second.job.status == "completed"
    # The third decided on the completed job: the fence refuses it, nothing is written.
    assert isinstance(third, Outcome) and not third.applied
    assert types_of(engine, a)[-2:] == ["job.heartbeat", "job.completed"]
    assert queue.get(a).result == 1  # type: ignore[union-attr]


def test_an_items_own_refusal_writes_nothing_for_it_and_spoils_nothing_else(engine: Engine) -> None:
    queue = queue_for(engine)
    a, b = leased(queue, engine, 2)
    before = types_of(engine, a)

    def refuses(_job: Any, _now: Any) -> list[Any]:
        raise ValueError("not this one")

    missing, refused, done = queue.mutate_many([("o/missing", settle(0)), (a, refuses), (b, settle("B"))])
    assert isinstance(missing, JobNotFound) and isinstance(refused, ValueError)
    assert isinstance(done, Outcome) and done.job.status == "completed"
    assert types_of(engine, a) == before


class Poison(Hook):
    """Makes one job's transition fail at the database (a division by zero beside its receipts);
    its ``after`` holds the first commit open until ``release`` is set."""

    name = "poison"

    def __init__(self, job_id: str | None = None) -> None:
        self.job_id = job_id
        self.release: threading.Event | None = None

    def during(self, change: Change) -> Write | None:
        if change.after.id != self.job_id:
            return None
        return Write(lambda conn: conn.execute(text("select 1 / 0")).scalar())

    def after(self, changes: Sequence[Change], results: Sequence[Any]) -> None:
        release, self.release = self.release, None
        if release is not None:
            assert release.wait(WAIT_S)


def concurrent_settlements(
    queue: Queue, first: str, others: list[str], hook: Poison
) -> dict[str, Outcome | BaseException]:
    """``first`` settles and its commit is held open (its after-commit half waits) while ``others``
    settle on other threads and queue behind it; then it is let go."""
    group = queue._group
    assert group is not None
    release = threading.Event()
    hook.release = release
    answers: dict[str, Outcome | BaseException] = {}

    def call(job_id: str) -> None:
        try:
            answers[job_id] = queue.mutate(job_id, settle(job_id))
        except BaseException as exc:
            answers[job_id] = exc

    with ThreadPoolExecutor(len(others) + 1) as pool:
        pool.submit(call, first)
        wait_for(lambda: hook.release is None, WAIT_S, what="the first commit to reach its after-commit half")
        for job_id in others:
            pool.submit(call, job_id)
        wait_for(lambda: len(group._pending) == len(others), WAIT_S, what="the others to queue")
        release.set()
    return answers


def grouped_queue(engine: Engine, hook: Poison) -> Queue:
    """Group commit with one commit in flight at a time, so every write behind the held one queues."""
    base = queue_for(engine)
    queue = Queue(engine, hooks=(*base.hooks, hook))
    queue._group = GroupCommit(queue, 64, in_flight=1)
    return queue


def test_concurrent_settlements_queued_behind_a_commit_share_the_next(
    engine: Engine, transactions: list[str]
) -> None:
    hook = Poison()
    queue = grouped_queue(engine, hook)
    first, *others = leased(queue, engine, 6)
    transactions.clear()
    answers = concurrent_settlements(queue, first, others, hook)
    assert all(isinstance(a, Outcome) and a.applied for a in answers.values()), answers
    assert queue._group is not None and queue._group.largest == 5
    # PostgreSQL: the first commit is one autocommitted statement, the five others one transaction.
    if engine.dialect.name == "postgresql":
        assert transactions == ["tx"]
    for job_id in [first, *others]:
        assert types_of(engine, job_id)[-1] == "job.completed"
        assert queue.get(job_id).result == job_id  # type: ignore[union-attr]


def test_a_shared_commit_whose_statement_fails_settles_every_other_write(pg_engine: Engine) -> None:
    engine = pg_engine  # SQLite divides by zero into NULL
    hook = Poison()
    queue = grouped_queue(engine, hook)
    first, *others = leased(queue, engine, 4)
    poisoned = others[1]
    hook.job_id = poisoned
    before = types_of(engine, poisoned)
    answers = concurrent_settlements(queue, first, others, hook)
    # The shared transaction failed and rolled back whole; each write was then committed alone,
    # so only the poisoned one failed, and its caller knows it did not settle.
    assert isinstance(answers[poisoned], DBAPIError) and "division by zero" in str(answers[poisoned])
    assert types_of(engine, poisoned) == before
    assert queue.get(poisoned).status == "running"  # type: ignore[union-attr]
    for job_id in [first, *others]:
        if job_id != poisoned:
            assert isinstance(answers[job_id], Outcome)
            # Exactly one completion: nothing of the rolled-back transaction stayed behind.
            assert types_of(engine, job_id).count("job.completed") == 1
