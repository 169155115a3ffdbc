"""Read-only queries for the dashboard: filtered job pages, counts by status, loop runs, recent events.

Every query is scoped the way the API scopes (one organisation, or every organisation for a
system identity), reads only projections and best-effort tables except ``recent_events``,
which reads the newest receipts through the primary key and says when its window was cut.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from sqlalchemy import ColumnElement, and_, case, false, func, not_, or_, select, true
from sqlalchemy.engine import Connection

from app.jobs.kinds import KINDS
from app.jobs.reducer import Job
from app.jobs.routing import INTEGRATION_KIND_PREFIX
from app.jobs.vocab import AGENT_CODEX, AGENT_FACTORY_CONTROL, STATUSES, WORKER_GROUPS
from app.storage.db import as_utc, db_now, deliveries, jobs, loop_runs, receipts
from app.storage.queue import decode_cursor, encode_cursor

# How many of the newest receipts ``recent_events`` reads at most (a backward primary-key scan).
RECENT_SCAN_LIMIT = 200_000


@dataclass(frozen=True)
class Scope:
    """Whose jobs a reader sees: one organisation, or all of them (system identities)."""

    organization_id: str | None
    all_organizations: bool = False


@dataclass(frozen=True)
class JobFilter:
    """The dashboard's list filters; ``None`` means "any". ``text`` matches inside the jobId."""

    status: str | None = None
    agent_id: str | None = None
    lane: str | None = None
    worker_group: str | None = None
    text: str | None = None
    organization_id: str | None = None


@dataclass(frozen=True)
class JobPage:
    jobs: list[Job]
    next_cursor: str | None


def worker_group_condition(group: str) -> ColumnElement[bool]:
    """SQL for "this job routes to ``group``": the order of ``app.jobs.routing.worker_group_for``.

    Routing is agent id first, kind second (a declared kind's ``route``; the spec's prefix for one
    no one declared); the condition for each group excludes the earlier rules, so every job matches
    exactly one group (a test compares it with the function).
    """
    agent = jobs.c.agent_id
    is_codex = or_(agent == AGENT_CODEX, _kind_routes_to("codex"))
    by_kind = or_(*(_kind_routes_to(g) for g in WORKER_GROUPS))
    if group == "codex":
        return is_codex
    if group == "control":
        return and_(
            not_(is_codex), or_(_kind_routes_to(group), and_(not_(by_kind), agent == AGENT_FACTORY_CONTROL))
        )
    if group == "chat":
        return and_(
            not_(is_codex), or_(_kind_routes_to(group), and_(not_(by_kind), agent != AGENT_FACTORY_CONTROL))
        )
    return false()


def _kind_routes_to(group: str) -> ColumnElement[bool]:
    """SQL for ``app.jobs.routing.kind_route(kind) == group``."""
    kind = jobs.c.kind
    declared = [name for name, k in KINDS.items() if k.route == group]
    condition: ColumnElement[bool] = kind.in_(declared) if declared else false()
    if group == "codex":
        undeclared = and_(kind.not_in(list(KINDS)), kind.startswith(INTEGRATION_KIND_PREFIX, autoescape=True))
        condition = or_(condition, undeclared)
    return condition


def _conditions(scope: Scope, f: JobFilter, *, with_status: bool) -> list[ColumnElement[bool]]:
    where: list[ColumnElement[bool]] = []
    if not scope.all_organizations:
        where.append(jobs.c.organization_id == scope.organization_id)
    elif f.organization_id is not None:
        where.append(jobs.c.organization_id == f.organization_id)
    if with_status and f.status is not None:
        where.append(jobs.c.status == f.status)
    if f.agent_id is not None:
        where.append(jobs.c.agent_id == f.agent_id)
    if f.lane is not None:
        where.append(jobs.c.lane == f.lane)
    if f.worker_group is not None:
        where.append(worker_group_condition(f.worker_group))
    if f.text:
        where.append(jobs.c.id.contains(f.text, autoescape=True))
    return where or [true()]


def list_jobs(
    conn: Connection, scope: Scope, f: JobFilter, *, limit: int = 50, cursor: str | None = None
) -> JobPage:
    """A page of jobs, newest first (the API's order and cursor)."""
    q = select(jobs.c.state, jobs.c.created_at, jobs.c.id).where(*_conditions(scope, f, with_status=True))
    if cursor:
        created, last_id = decode_cursor(cursor)
        q = q.where(or_(jobs.c.created_at < created, and_(jobs.c.created_at == created, jobs.c.id < last_id)))
    rows = conn.execute(q.order_by(jobs.c.created_at.desc(), jobs.c.id.desc()).limit(limit + 1)).all()
    page = [Job.from_json(r.state) for r in rows[:limit]]
    next_cursor = None
    if len(rows) > limit:
        last = rows[limit - 1]
        next_cursor = encode_cursor(as_utc(last.created_at), last.id)
    return JobPage(page, next_cursor)


def status_counts(conn: Connection, scope: Scope, f: JobFilter) -> dict[str, int]:
    """Jobs per status under every filter but the status itself (each of the six, zeros included)."""
    q = (
        select(jobs.c.status, func.count())
        .where(*_conditions(scope, f, with_status=False))
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
