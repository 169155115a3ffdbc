"""Queue transitions and delivery reads that only tests use directly: the worker path settles through
``Queue.settle_attempt`` (which also honours a pending abort), never through these.

Each appends one receipt under the attempt fence, exactly as a lease holder would, so tests can
reach a state (completed, canceled in flight) or race a stale holder without running a worker.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection, Engine

from app.jobs.transitions import fenced_holder
from app.storage.db import deliveries
from app.storage.queue import Outcome, Queue


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
