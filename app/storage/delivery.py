"""Delivery records — the spec's driver/execute "promises" — kept in Postgres, keyed by dispatch key.

A delivery is *pending* from the moment the driver starter creates it until the attempt it
started settles, or until its deadline (the driver invocation timeout) passes; after that it is
terminal and the next start on the same key advances the delivery generation, bounded at 32.

These rows are best-effort bookkeeping, not ownership: losing them loses no job, because the
queued redrive re-delivers from receipts. Celery task ids are derived from key + generation.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import func, select, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from app.jobs.errors import (
    ACTIVE_DELIVERY_REASON,
    MAX_DELIVERY_GENERATIONS,
    DeliveryGenerationsExceeded,
    generations_exceeded_message,
)
from app.jobs.vocab import AttemptStatus, DeliveryOutcome, Status
from app.storage.db import as_utc, deliveries


@dataclass(frozen=True)
class StartDecision:
    """What the driver starter did: created a delivery (and its task id) or not, and why."""

    created: bool
    dispatch_key: str
    generation: int
    task_id: str | None = None
    reason: str | None = None


def redrive_key(job_id: str, seq: int, status: Status) -> str:
    """Spec: the redrive dispatch key ``<jobId>:redrive:<a>:<b>`` — one observed queue state."""
    return f"{job_id}:redrive:{seq}:{status}"


def attempt_fence(job_id: str, attempt: int) -> str:
    """Spec: the worker RPC's attempt fence id ``<jobId>:attempt:<n>``."""
    return f"{job_id}:attempt:{attempt}"


def parse_fence(fence: str) -> tuple[str, int]:
    job_id, _, attempt = fence.rpartition(":attempt:")
    return job_id, int(attempt)


def driver_task_id(dispatch_key: str, generation: int) -> str:
    return f"{dispatch_key}:driver:{generation}"


def decide_generation(
    last_generation: int | None, last_pending: bool, job_id: str, key: str
) -> StartDecision:
    """Pure rule: first delivery is generation 0; a pending one blocks; a terminal one advances.

    Past ``MAX_DELIVERY_GENERATIONS`` the starter errors (spec: "exceeded 32 generations").
    """
    if last_generation is None:
        return StartDecision(True, key, 0, driver_task_id(key, 0))
    if last_pending:
        return StartDecision(False, key, last_generation, reason=ACTIVE_DELIVERY_REASON)
    nxt = last_generation + 1
    if nxt >= MAX_DELIVERY_GENERATIONS:
        raise DeliveryGenerationsExceeded(generations_exceeded_message(job_id))
    return StartDecision(True, key, nxt, driver_task_id(key, nxt))


def begin(
    conn: Connection, job_id: str, dispatch_key: str, now: datetime, driver_timeout_ms: int
) -> StartDecision:
    """The driver starter's bookkeeping: record a new pending delivery unless one is active."""
    last = conn.execute(
        select(deliveries.c.generation, deliveries.c.state, deliveries.c.deadline_at)
        .where(deliveries.c.dispatch_key == dispatch_key)
        .order_by(deliveries.c.generation.desc())
        .limit(1)
    ).first()
    pending = bool(last and last.state == "pending" and as_utc(last.deadline_at) > now)
    decision = decide_generation(last.generation if last else None, pending, job_id, dispatch_key)
    if not decision.created:
        return decision
    assert decision.task_id is not None
    try:
        with conn.begin_nested():
            conn.execute(
                deliveries.insert().values(
                    dispatch_key=dispatch_key,
                    generation=decision.generation,
                    job_id=job_id,
                    task_id=decision.task_id,
                    state="pending",
                    created_at=now,
                    deadline_at=now + timedelta(milliseconds=driver_timeout_ms),
                )
            )
    except IntegrityError:
        # A concurrent starter created this generation first: that delivery is the active one.
        return StartDecision(False, dispatch_key, decision.generation, reason=ACTIVE_DELIVERY_REASON)
    return decision


def settle(
    conn: Connection,
    dispatch_key: str,
    generation: int,
    outcome: DeliveryOutcome | AttemptStatus,
    now: datetime,
) -> None:
    """Mark a delivery terminal (idempotent: the first outcome wins)."""
    conn.execute(
        update(deliveries)
        .where(
            deliveries.c.dispatch_key == dispatch_key,
            deliveries.c.generation == generation,
            deliveries.c.state == "pending",
        )
        .values(state="settled", outcome=outcome[:64], settled_at=now)
    )


def last_started_at(conn: Connection, job_id: str) -> datetime | None:
    """When the latest delivery of this job (any key) was created: the redrive cooldown's input."""
    value = conn.execute(
        select(func.max(deliveries.c.created_at)).where(deliveries.c.job_id == job_id)
    ).scalar()
    return as_utc(value) if value is not None else None
