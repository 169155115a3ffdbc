"""Queue transitions and delivery reads that only tests use directly: the worker path settles through
``Queue.settle_attempt`` (which also honours a pending abort), never through these.

Each appends one receipt under the attempt fence, exactly as a lease holder would, so tests can
reach a state (completed, canceled in flight) or race a stale holder without running a worker.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Connection, Engine

from app.jobs.transitions import fenced_holder, lease_queued
from app.storage import delivery
from app.storage import queue as queue_module
from app.storage.db import deliveries, transaction
from app.storage.queue import Outcome, Queue


def lease(queue: Queue, job_id: str, worker_id: str, lease_ms: int, *, start: bool = False) -> Outcome:
    """Lease a queued job as a worker would before running it (``start``: with its first heartbeat).
    The worker path itself starts through ``Queue.start_attempt``."""
    return queue.mutate(job_id, lambda job, now: lease_queued(job, now, worker_id, lease_ms, start=start))


def settle_deliveries(conn: Connection, job_id: str, outcome: str, now: datetime) -> None:
    """End every pending delivery of a job, as the delivery-settlement hook does in a transition."""
    delivery.SETTLE_JOB.count(conn, delivery.settle_job_params(job_id, outcome, now))


def complete(queue: Queue, job_id: str, worker_id: str, attempt: int, result: Any = None) -> Outcome:
    """``job.completed`` under the fence (no abort check: the raw transition)."""
    body = {"result": result}
    return queue.mutate(
        job_id, lambda job, now: fenced_holder(job, worker_id, attempt, "job.completed", body)
    )


def settle_canceled(queue: Queue, job_id: str, worker_id: str, attempt: int, reason: str | None) -> Outcome:
    """``job.canceled`` by the lease holder: work in flight stopped after an abort."""
    body = {"reason": reason}
    return queue.mutate(job_id, lambda job, now: fenced_holder(job, worker_id, attempt, "job.canceled", body))


def has_active(conn: Connection, job_id: str, now: datetime) -> bool:
    """True if any delivery of this job is pending and within its deadline."""
    return (
        conn.execute(
            select(deliveries.c.generation)
            .where(
                deliveries.c.job_id == job_id, deliveries.c.state == "pending", deliveries.c.deadline_at > now
            )
            .limit(1)
        ).first()
        is not None
    )


# Queues whose background ledger writers must stop before their engine's database goes away
# (tests/conftest.py closes them at the engine's teardown): none then writes into a dropped one.
_CLOSE_WITH_ENGINE: dict[Engine, list[Queue]] = {}


def closed_with_engine(queue: Queue) -> None:
    _CLOSE_WITH_ENGINE.setdefault(queue.engine, []).append(queue)


def close_queues(engine: Engine) -> None:
    for queue in _CLOSE_WITH_ENGINE.pop(engine, []):
        queue.close()


@pytest.fixture
def transactions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Counts the transactions the queue opens (the one-statement path opens none)."""
    opened: list[str] = []
    real = transaction

    @contextmanager
    def counted(engine: Engine) -> Iterator[Connection]:
        opened.append("tx")
        with real(engine) as conn:
            yield conn

    monkeypatch.setattr(queue_module, "transaction", counted)
    return opened
