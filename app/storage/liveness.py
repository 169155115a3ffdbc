"""Worker liveness records (``worker_liveness``) and the expiry of a dead process's jobs.

The rules are in ``app/jobs/liveness.py``. Why the record lives in PostgreSQL, beside the jobs, and
not in the broker's Redis (which already keeps a consumer liveness key, ``delivery/fetches.py``):
declaring a process dead hands its jobs to someone else, so it must be decided by the store and the
clock that decide leases, and a process must fence itself on reaching that same store. A worker
cut off from PostgreSQL but not from Redis can no longer heartbeat its jobs: with a Redis record it
would look alive while its leases run out. The cost is one short UPDATE per process every couple
of seconds.

Best-effort bookkeeping, not truth: a renewal re-inserts a missing row, so a lost table rebuilds
itself within one interval; a row that never comes back (lost with its process) only delays that
process's jobs to their own lease expiry, which is how every job was recovered before.

A row marked dead (``dead_at``) is never renewed again: the process that comes back from a
partition finds it dead, fences itself (it already has, by its own clock) and takes a new identity.
Rows dead for ``FORGET_AFTER`` are deleted.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from sqlalchemy import and_, delete, func, insert, or_, select, update
from sqlalchemy.engine import Connection, Engine

from app.jobs import liveness as rules
from app.jobs.reducer import Job
from app.jobs.vocab import LEASED_STATUSES
from app.storage.db import db_now, jobs, transaction, worker_liveness
from app.storage.queue import Queue

FORGET_AFTER = timedelta(hours=1)
RECHECK_DEAD_FOR = timedelta(minutes=5)

Renewal = Literal["renewed", "inserted", "dead"]


@dataclass(frozen=True)
class Offer:
    """What a live process offers the dispatch pass (docs/dispatch.md): the worker queues it
    consumes and how many attempts it runs at once. ``slots`` falls to 0 once it stops taking work."""

    queues: str  # ``app.dispatch.line.queues_field``
    slots: int


def _offered(offer: Offer | None) -> dict[str, object]:
    return {} if offer is None else {"queues": offer.queues, "slots": offer.slots}


def register(engine: Engine, process: str, role: str, offer: Offer | None = None) -> datetime:
    """Insert ``process``'s row at its start (database clock); returns the time recorded."""
    with transaction(engine) as conn:
        now = db_now(conn)
        conn.execute(
            insert(worker_liveness).values(
                process_id=process, role=role, started_at=now, renewed_at=now, dead_at=None, **_offered(offer)
            )
        )
    return now


def renew(engine: Engine, process: str, role: str, offer: Offer | None = None) -> Renewal:
    """Renew ``process``'s row (and what it offers): ``renewed``; ``inserted`` when it was missing
    (the table was rebuilt); ``dead`` when the loop declared it dead (the process must not go on)."""
    with transaction(engine) as conn:
        now = db_now(conn)
        done = conn.execute(
            update(worker_liveness)
            .where(worker_liveness.c.process_id == process, worker_liveness.c.dead_at.is_(None))
            .values(renewed_at=now, **_offered(offer))
        ).rowcount
        if done:
            return "renewed"
        exists = conn.execute(
            select(worker_liveness.c.process_id).where(worker_liveness.c.process_id == process)
        ).first()
        if exists is not None:
            return "dead"
        conn.execute(
            insert(worker_liveness).values(
                process_id=process, role=role, started_at=now, renewed_at=now, dead_at=None, **_offered(offer)
            )
        )
        return "inserted"


def forget_unless_holding(engine: Engine, process: str) -> bool:
    """Delete ``process``'s row unless a job is still leased under it (a clean stop); True if deleted."""
    with transaction(engine) as conn:
        if _held_ids(conn, process, 1):
            return False
        conn.execute(delete(worker_liveness).where(worker_liveness.c.process_id == process))
    return True


@dataclass(frozen=True)
class Record:
    process_id: str
    role: str
    started_at: datetime
    renewed_at: datetime
    dead_at: datetime | None


def records(engine: Engine) -> list[Record]:
    with engine.connect() as conn:
        rows = conn.execute(select(worker_liveness).order_by(worker_liveness.c.process_id)).all()
    return [Record(r.process_id, r.role, r.started_at, r.renewed_at, r.dead_at) for r in rows]


def _held_ids(conn: Connection, process: str, limit: int) -> list[str]:
    prefix = func.substr(jobs.c.lease_worker_id, 1, len(process))
    return list(
        conn.execute(
            select(jobs.c.id)
            .where(jobs.c.status.in_(sorted(LEASED_STATUSES)), prefix == process)
            .order_by(jobs.c.id)
            .limit(limit)
        )
        .scalars()
        .all()
    )


@dataclass(frozen=True)
class Declared:
    """One process the pass declared dead, and the jobs whose leases it expired."""

    process_id: str
    renewed_at: datetime
    expired: list[str]


def _expire(process: str, job: Job, now: datetime) -> Sequence[rules.Event]:
    return rules.expire_held(job, process, now)


def expire_dead(
    queue: Queue, dead_after_ms: int, *, limit: int = 500, between: Callable[[], None] | None = None
) -> list[Declared]:
    """Declare dead every process whose record lapsed past ``dead_after_ms`` (database clock), and
    append ``job.lease_expired`` (reason ``worker <id> liveness lapsed``) for each job it holds.

    The row is marked dead in its own transaction *before* any job is expired, and only while it
    still lapsed, so a renewal racing the pass either lands first (the process lives) or finds its
    row dead. A process whose jobs exceed ``limit`` keeps being declared until none is left. Rows
    dead for ``FORGET_AFTER`` are deleted."""
    engine = queue.engine
    found: list[Declared] = []
    with transaction(engine) as conn:
        now = db_now(conn)
        conn.execute(delete(worker_liveness).where(worker_liveness.c.dead_at < now - FORGET_AFTER))
        cutoff = rules.lapsed_before(now, dead_after_ms)
        lapsed = conn.execute(
            select(worker_liveness.c.process_id, worker_liveness.c.renewed_at).where(
                or_(
                    and_(worker_liveness.c.dead_at.is_(None), worker_liveness.c.renewed_at < cutoff),
                    # Declared lately, but jobs may be left (over the limit, or a pass that died).
                    worker_liveness.c.dead_at >= now - RECHECK_DEAD_FOR,
                )
            )
        ).all()
    for process, renewed_at in lapsed:
        if between is not None:
            between()
        with transaction(engine) as conn:
            now = db_now(conn)
            newly = conn.execute(
                update(worker_liveness)
                .where(
                    worker_liveness.c.process_id == process,
                    worker_liveness.c.dead_at.is_(None),
                    worker_liveness.c.renewed_at < rules.lapsed_before(now, dead_after_ms),
                )
                .values(dead_at=now)
            ).rowcount
            marked = conn.execute(
                select(worker_liveness.c.dead_at).where(worker_liveness.c.process_id == process)
            ).scalar()
        if marked is None:
            continue  # renewed meanwhile (or forgotten): alive after all
        with engine.connect() as conn:
            held = _held_ids(conn, process, limit)
        expired = []
        for job_id in held:
            if between is not None:
                between()
            out = queue.mutate(job_id, functools.partial(_expire, process))
            if out.applied:
                expired.append(job_id)
        if newly or expired:
            found.append(Declared(process, renewed_at, expired))
    return found
