"""The callback outbox: durable callback events, recorded with their receipts, sent at least once.

Spec step 6 names the events (``dispatched``, ``completed``, ``failed``, ``canceled``) and the
targets (``RECEIPT_RESONATE_CALLBACK_URL``, ``RECEIPT_EVENT_CALLBACK_URL``). They are
durable: a terminal receipt and its outbox rows commit in one transaction (whichever process
wrote the receipt: a worker, the driver, a loop, or the API cancelling a queued job), so a process
dying right after it settles cannot lose the callback. Each row has a stable event id, used as the
Standard Webhooks ``webhook-id`` on every attempt so a receiver can drop duplicates.

Delivery rules (pure, below): per target and per job in receipt order; a failed attempt backs off
exponentially (``base * 2^(n-1)`` capped at ``max``); a row still failing ``give_up_ms`` after it
was written (24 h by default) is dead-lettered and listed by ``receipt callbacks``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.engine import Connection

from app.jobs.reducer import Job
from app.storage.db import as_utc, callback_outbox

CALLBACK_EVENTS = ("dispatched", "completed", "failed", "canceled")


def event_id(job_id: str, event: str, key: str) -> str:
    """A stable id for one callback event of one job (``key``: the receipt seq or the fence)."""
    digest = hashlib.sha256(f"{job_id}\n{event}\n{key}".encode()).hexdigest()[:32]
    return f"evt_{digest}"


def callback_body(event: str, job: Job, evt_id: str) -> dict[str, Any]:
    # The job as its organisation's API answers name it: the client's jobId, the organisation, and
    # the qualified stream (the id alone is unique within an organisation only).
    return {
        "eventId": evt_id,
        "event": event,
        "jobId": job.client_id,
        "organizationId": job.organization_id,
        "agentId": job.agent_id,
        "status": job.status,
        "attempt": job.attempt,
        "result": job.result,
        "error": job.error,
        "stream": job.stream,
        "seq": job.seq,
    }


def record(
    conn: Connection, targets: Sequence[str], event: str, job: Job, now: datetime, key: str | None = None
) -> list[str]:
    """Write one pending row per target for this event (idempotent on (target, event id))."""
    if event not in CALLBACK_EVENTS or not targets:
        return []
    evt = event_id(job.id, event, key if key is not None else str(job.seq))
    body = json.dumps(callback_body(event, job, evt), separators=(",", ":"), sort_keys=True)
    existing = set(
        conn.execute(
            select(callback_outbox.c.target).where(
                callback_outbox.c.event_id == evt, callback_outbox.c.target.in_(list(targets))
            )
        ).scalars()
    )
    for target in targets:
        if target in existing:
            continue
        conn.execute(
            callback_outbox.insert().values(
                event_id=evt,
                target=target,
                job_id=job.id,
                event=event,
                seq=job.seq,
                body=body,
                state="pending",
                attempts=0,
                next_attempt_at=now,
                created_at=now,
            )
        )
    return [evt]


def forget(conn: Connection, evt_id: str) -> None:
    """Drop a ``dispatched`` event whose message never left (rows are bookkeeping, not receipts)."""
    conn.execute(
        callback_outbox.delete().where(
            callback_outbox.c.event_id == evt_id, callback_outbox.c.state == "pending"
        )
    )


@dataclass(frozen=True)
class Row:
    id: int
    event_id: str
    target: str
    job_id: str
    event: str
    seq: int
    body: str
    attempts: int
    created_at: datetime
    next_attempt_at: datetime


def due(conn: Connection, now: datetime, limit: int = 2000) -> list[Row]:
    """The head of every (target, job) line whose next attempt is due, oldest first.

    Only a line's head may be sent: a later event of the same job waits until every earlier one
    is delivered or dead, so a receiver sees each job's events in receipt order.
    """
    c = callback_outbox.c
    rows = conn.execute(
        select(c.id, c.event_id, c.target, c.job_id, c.event, c.seq, c.body, c.attempts, c.created_at)
        .add_columns(c.next_attempt_at)
        .where(c.state == "pending")
        .order_by(c.id)
        .limit(limit)
    ).all()
    heads: dict[tuple[str, str], Any] = {}
    for r in rows:
        line = (r.target, r.job_id)
        if line not in heads or (r.seq, r.id) < (heads[line].seq, heads[line].id):
            heads[line] = r
    out = [
        Row(
            r.id,
            r.event_id,
            r.target,
            r.job_id,
            r.event,
            r.seq,
            r.body,
            r.attempts,
            as_utc(r.created_at),
            as_utc(r.next_attempt_at),
        )
        for r in heads.values()
    ]
    return sorted((r for r in out if r.next_attempt_at <= now), key=lambda r: r.id)


def backoff_ms(attempts: int, base_ms: int, max_ms: int) -> int:
    """Pure rule: the wait after the ``attempts``-th failure: base, 2x, 4x, … capped at max."""
    return int(min(max_ms, base_ms * 2 ** max(0, min(attempts - 1, 40))))


def mark_delivered(conn: Connection, row_id: int, now: datetime) -> None:
    conn.execute(
        update(callback_outbox)
        .where(callback_outbox.c.id == row_id, callback_outbox.c.state == "pending")
        .values(state="delivered", delivered_at=now, attempts=callback_outbox.c.attempts + 1)
    )


def mark_failed(
    conn: Connection, row: Row, error: str, now: datetime, *, base_ms: int, max_ms: int, give_up_ms: int
) -> str:
    """Record a failed attempt: back off, or dead-letter once ``give_up_ms`` has passed. Returns the state."""
    attempts = row.attempts + 1
    dead = now - row.created_at >= timedelta(milliseconds=give_up_ms)
    state = "dead" if dead else "pending"
    conn.execute(
        update(callback_outbox)
        .where(callback_outbox.c.id == row.id, callback_outbox.c.state == "pending")
        .values(
            state=state,
            attempts=attempts,
            last_error=error[:512],
            next_attempt_at=now + timedelta(milliseconds=backoff_ms(attempts, base_ms, max_ms)),
        )
    )
    return state


def listing(conn: Connection, state: str | None = None, limit: int = 100) -> list[dict[str, Any]]:
    """Rows for the operator (newest first), without bodies."""
    c = callback_outbox.c
    q = select(
        c.id, c.event_id, c.target, c.job_id, c.event, c.state, c.attempts, c.created_at, c.last_error
    ).order_by(c.id.desc())
    if state is not None:
        q = q.where(c.state == state)
    return [dict(r._mapping) for r in conn.execute(q.limit(limit)).all()]


def counts(conn: Connection) -> dict[str, int]:
    c = callback_outbox.c
    return {
        r.state: int(r.n) for r in conn.execute(select(c.state, func.count().label("n")).group_by(c.state))
    }
