"""Read-only queries for the dashboard: filtered job pages, counts by status, loop runs, recent events.

Every query is scoped the way the API scopes (one organisation, or every organisation for a
system identity), reads only projections and best-effort tables except ``recent_events``,
which reads the newest receipts through the primary key and says when its window was cut.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import and_, case, func, select
from sqlalchemy.engine import Connection

from app.jobs.vocab import STATUSES
from app.storage import search
from app.storage.db import as_utc, db_now, deliveries, jobs, loop_runs, receipts

# How many of the newest receipts ``recent_events`` reads at most (a backward primary-key scan).
RECENT_SCAN_LIMIT = 200_000


# The filter and the pager are the search's (one for every list): re-exported for the dashboard.
Scope = search.Scope
JobFilter = search.JobFilter
JobPage = search.JobPage
worker_group_condition = search.worker_group_condition


def list_jobs(
    conn: Connection, scope: Scope, f: JobFilter, *, limit: int = 50, cursor: str | None = None
) -> JobPage:
    """A page of jobs, newest first (the API's order and cursor)."""
    return search.list_jobs(conn, scope, f, limit=limit, cursor=cursor)


def status_counts(conn: Connection, scope: Scope, f: JobFilter) -> dict[str, int]:
    """Jobs per status under every filter but the status itself (each of the six, zeros included)."""
    q = (
        select(jobs.c.status, func.count())
        .where(*search.conditions(conn, scope, f, with_status=False))
        .group_by(jobs.c.status)
    )
    counts = dict.fromkeys(STATUSES, 0)
    for status, n in conn.execute(q).all():
        counts[str(status)] = int(n)
    return counts


@dataclass(frozen=True)
class LoopRun:
    """One recovery loop's last pass, from ``loop_runs`` (best-effort bookkeeping)."""

    name: str
    started_at: datetime | None
    finished_at: datetime | None
    owner: str | None

    @property
    def running(self) -> bool:
        return self.started_at is not None and (
            self.finished_at is None or self.finished_at < self.started_at
        )

    @property
    def duration_ms(self) -> float | None:
        if self.running or self.started_at is None or self.finished_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds() * 1000


def loop_runs_all(conn: Connection) -> list[LoopRun]:
    rows = conn.execute(select(loop_runs).order_by(loop_runs.c.name)).all()
    return [
        LoopRun(
            r.name,
            as_utc(r.started_at) if r.started_at else None,
            as_utc(r.finished_at) if r.finished_at else None,
            r.owner,
        )
        for r in rows
    ]


@dataclass(frozen=True)
class RecentEvents:
    """Counts over a recent window. ``complete`` is False when the scan limit cut the window short."""

    since: datetime
    now: datetime
    counts: Mapping[str, int] = field(default_factory=dict)
    complete: bool = True


# The receipt types the system page counts, and what it calls them.
RECENT_RECEIPT_TYPES = ("job.lease_expired", "job.released", "job.failed", "job.completed", "job.enqueued")


def recent_events(
    conn: Connection, *, window: timedelta, scan_limit: int = RECENT_SCAN_LIMIT
) -> RecentEvents:
    """Receipts of ``RECENT_RECEIPT_TYPES`` and redrive deliveries started within ``window``.

    Receipts are read newest first through the primary key (ids grow with append time), at most
    ``scan_limit`` of them, so the cost is bounded however long the log is; when the limit ends
    the scan before the window does, the counts are lower bounds and ``complete`` says so.
    Redrives are delivery records whose dispatch key is a redrive key (``<jobId>:redrive:…``).
    """
    now = db_now(conn)
    since = now - window
    newest = (
        select(receipts.c.type, receipts.c.at).order_by(receipts.c.id.desc()).limit(scan_limit).subquery()
    )
    # One pass over the window: the total read, its oldest time, and a count per type.
    in_window = newest.c.at >= since
    per_type = [
        func.coalesce(func.sum(case((and_(in_window, newest.c.type == t), 1), else_=0)), 0)
        for t in RECENT_RECEIPT_TYPES
    ]
    scanned, oldest, *numbers = conn.execute(select(func.count(), func.min(newest.c.at), *per_type)).one()
    counts: dict[str, int] = {t: int(n) for t, n in zip(RECENT_RECEIPT_TYPES, numbers, strict=True)}
    redrives = conn.execute(
        select(func.count()).where(
            deliveries.c.created_at >= since, deliveries.c.dispatch_key.contains(":redrive:", autoescape=True)
        )
    ).scalar_one()
    counts["redrive"] = int(redrives)
    complete = int(scanned) < scan_limit or oldest is None or as_utc(oldest) < since
    return RecentEvents(since, now, counts, complete)
