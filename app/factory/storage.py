"""The Factory's storage seam: ``objectives/<id>`` streams and their two projections.

Every write takes the caller's connection (the caller owns the transaction) and serialises on the
objective with ``lock_key`` — one objective is one short critical section, so a burst of task
settlements each writing a control request queue up instead of failing each other's appends.
Reads never lock. The projection is written in the receipt's transaction:

- ``objectives``: one row per objective — its state without the tasks (``Objective.header_json``),
  plus the columns the loops scan (status, pending requests, audited);
- ``objective_tasks``: one row per task, so a control step reads and rewrites only the tasks it
  touches (O(tasks whose state changed), not O(all tasks)).

``rebuild`` re-folds every ``objectives/`` stream from receipts alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import and_, bindparam, delete, or_, select, update
from sqlalchemy.engine import Connection

from app.factory.reducer import Objective, Task, fold, reduce
from app.factory.vocab import OBJECTIVE_STREAM_PREFIX, objective_stream
from app.jobs.errors import AppendConflict
from app.jobs.ids import KEY_SEPARATOR, SYSTEM_ORGANIZATION, qualify
from app.storage import keyset, store
from app.storage.db import as_utc, db_now, lock_key, objective_tasks, objectives, parse_iso

Event = tuple[str, Mapping[str, Any]]


@dataclass(frozen=True)
class Loaded:
    """An objective as read from the projection (header + the tasks asked for) and its stream head."""

    objective: Objective
    last_hash: str
    status_changed_at: datetime


def lock(conn: Connection, objective_id: str) -> None:
    lock_key(conn, f"objective:{objective_id}")


def key_of(conn: Connection, organization_id: str | None, objective_id: str) -> str | None:
    """The key of the objective an organisation knows as ``objective_id``, if it has one: the
    qualified key, or a bare key of the same organisation (written before keys were qualified).
    Another organisation's objective of the same id is exactly as absent."""
    if KEY_SEPARATOR in objective_id:
        return None  # a client id never holds the separator
    org = organization_id or SYSTEM_ORGANIZATION
    key = qualify(org, objective_id)
    found = conn.execute(
        select(objectives.c.id)
        .where(
            or_(
                objectives.c.id == key,
                and_(objectives.c.id == objective_id, objectives.c.organization_id == org),
            )
        )
        .limit(1)
    ).scalar()
    return None if found is None else str(found)


# -- reads --------------------------------------------------------------------------------------


def load(
    conn: Connection,
    objective_id: str,
    *,
    task_ids: Iterable[str] = (),
    statuses: Sequence[str] = (),
    all_tasks: bool = False,
) -> Loaded | None:
    """The header, plus the named tasks, the tasks in ``statuses``, or every task."""
    row = conn.execute(
        select(objectives.c.state, objectives.c.last_hash, objectives.c.status_changed_at).where(
            objectives.c.id == objective_id
        )
    ).first()
    if row is None:
        return None
    loaded = Loaded(Objective.from_header(row.state, {}), row.last_hash, as_utc(row.status_changed_at))
    if all_tasks:
        return with_tasks(conn, loaded, all_tasks=True)
    return with_tasks(conn, loaded, task_ids=task_ids, statuses=statuses)


def with_tasks(
    conn: Connection,
    loaded: Loaded,
    *,
    task_ids: Iterable[str] = (),
    statuses: Sequence[str] = (),
    all_tasks: bool = False,
) -> Loaded:
    """``loaded`` with more tasks read (tasks already loaded are kept as they are)."""
    obj = loaded.objective
    have = set(obj.tasks)
    wanted = [t for t in dict.fromkeys(task_ids) if t not in have]
    conds = []
    if all_tasks:
        conds.append(objective_tasks.c.objective_id == obj.id)
    else:
        if wanted:
            conds.append(objective_tasks.c.task_id.in_(wanted))
        if statuses:
            conds.append(objective_tasks.c.status.in_(list(statuses)))
    if not conds:
        return loaded
    rows = conn.execute(
        select(objective_tasks.c.state).where(objective_tasks.c.objective_id == obj.id, or_(*conds))
    ).all()
    tasks = dict(obj.tasks)
    for r in rows:
        if r.state["id"] not in tasks:
            tasks[r.state["id"]] = Task.from_json(r.state)
    return replace(loaded, objective=replace(obj, tasks=tasks))


def task_results(conn: Connection, objective_id: str, task_ids: Sequence[str]) -> dict[str, Any]:
    """The recorded results of the given tasks (a ready task's ``inputs``)."""
    if not task_ids:
        return {}
    rows = conn.execute(
        select(objective_tasks.c.task_id, objective_tasks.c.state).where(
            objective_tasks.c.objective_id == objective_id, objective_tasks.c.task_id.in_(list(task_ids))
        )
    ).all()
    return {r.task_id: r.state.get("result") for r in rows}


def receipts_after(conn: Connection, objective_id: str, seq: int) -> list[store.StoredReceipt]:
    return store.read_stream(conn, objective_stream(objective_id), after=seq)


def with_pending(conn: Connection, limit: int) -> list[str]:
    """Objectives with unconsumed control requests, oldest request first (the outbox redrive's scan)."""
    return list(
        conn.execute(
            select(objectives.c.id)
            .where(objectives.c.pending_count > 0)
            .order_by(objectives.c.updated_at)
            .limit(limit)
        ).scalars()
    )


def unaudited(conn: Connection, older_than_ms: int, limit: int) -> list[str]:
    """Terminal objectives still without an audit after ``older_than_ms`` (their audit job was lost)."""
    now = db_now(conn)
    return list(
        conn.execute(
            select(objectives.c.id)
            .where(
                objectives.c.status.in_(["completed", "failed", "canceled"]),
                objectives.c.audited.is_(False),
                objectives.c.status_changed_at <= now - timedelta(milliseconds=older_than_ms),
            )
            .order_by(objectives.c.status_changed_at)
            .limit(limit)
        ).scalars()
    )


def active_ids(conn: Connection, after_id: str | None, limit: int) -> list[str]:
    """A page of active objectives by id (resume at startup pages through them)."""
    q = select(objectives.c.id).where(objectives.c.status == "active")
    if after_id is not None:
        q = q.where(objectives.c.id > after_id)
    return list(conn.execute(q.order_by(objectives.c.id).limit(limit)).scalars())


@dataclass(frozen=True)
class Page:
    objectives: list[Objective]
    next_cursor: str | None


def list_page(
    conn: Connection,
    *,
    organization_id: str | None,
    all_organizations: bool,
    status: str | None,
    limit: int,
    cursor: str | None,
) -> Page:
    """Objectives newest first (headers only), keyset-paged on (createdAt, id)."""
    q = select(objectives.c.state, objectives.c.created_at, objectives.c.id)
    if not all_organizations:
        q = q.where(objectives.c.organization_id == organization_id)
    if status is not None:
        q = q.where(objectives.c.status == status)
    c = objectives.c
    rows, next_cursor = keyset.page(
        conn.execute(keyset.newest_first(q, c.created_at, c.id, cursor, limit)).all(), limit
    )
    return Page([Objective.from_header(r.state, {}) for r in rows], next_cursor)


# -- writes -------------------------------------------------------------------------------------


def apply(
    conn: Connection, loaded: Loaded | None, objective_id: str, events: Sequence[Event], *, at: datetime
) -> Loaded:
    """Append ``events`` after ``loaded`` (one statement), fold them, and write the projection rows
    that changed."""
    chained, state = store.advance(
        objective_stream(objective_id),
        loaded.objective if loaded else None,
        (loaded.objective.seq, loaded.last_hash) if loaded else (0, None),
        events,
        reduce,
        at=at,
    )
    last = chained.stored(store.insert(conn, chained))[-1]
    return _save(conn, state, loaded, last)


def _header_columns(obj: Objective, last_hash: str, changed_at: datetime) -> dict[str, Any]:
    return {
        "organization_id": obj.organization_id,
        "status": obj.status,
        "phase": obj.phase,
        "title": obj.title[:256],
        "created_at": parse_iso(obj.created_at),
        "updated_at": parse_iso(obj.updated_at),
        "status_changed_at": changed_at,
        "pending_count": len(obj.pending),
        "pending_seq": obj.pending[0].seq if obj.pending else None,
        "audited": obj.audit is not None,
        "last_seq": obj.seq,
        "last_hash": last_hash,
        "state": obj.header_json(),
    }


def _task_columns(task: Task) -> dict[str, Any]:
    return {
        "status": task.status,
        "job_id": task.job_id,
        "deps_remaining": task.deps_remaining,
        "state": task.to_json(),
    }


_UPDATE_HEADER = update(objectives).where(
    objectives.c.id == bindparam("b_id"), objectives.c.last_seq == bindparam("b_seq")
)
_UPDATE_TASK = update(objective_tasks).where(
    objective_tasks.c.objective_id == bindparam("b_objective"),
    objective_tasks.c.task_id == bindparam("b_task"),
)


def _save(conn: Connection, obj: Objective, previous: Loaded | None, last: store.StoredReceipt) -> Loaded:
    at = parse_iso(last.at)
    assert at is not None
    if previous is None:
        conn.execute(objectives.insert().values(id=obj.id, **_header_columns(obj, last.hash, at)))
        rows = [{"objective_id": obj.id, "task_id": t.id, **_task_columns(t)} for t in obj.tasks.values()]
        if rows:
            conn.execute(objective_tasks.insert(), rows)
        return Loaded(obj, last.hash, at)
    before = previous.objective
    changed_at = at if before.status != obj.status else previous.status_changed_at
    result = conn.execute(
        _UPDATE_HEADER, {"b_id": obj.id, "b_seq": before.seq, **_header_columns(obj, last.hash, changed_at)}
    )
    if result.rowcount != 1:
        raise AppendConflict(f"objectives/{obj.id}: projection moved past seq {before.seq}")
    # Only tasks the fold replaced changed (the reducer keeps untouched Task objects as they were).
    changed = [
        {"b_objective": obj.id, "b_task": t.id, **_task_columns(t)}
        for tid, t in obj.tasks.items()
        if tid in before.tasks and before.tasks[tid] is not t
    ]
    if changed:
        conn.execute(_UPDATE_TASK, changed)
    if obj.phase != before.phase:
        # A replan: the new phase's tasks get their rows (task ids are unique across phases).
        rows = [
            {"objective_id": obj.id, "task_id": t.id, **_task_columns(t)}
            for t in obj.tasks.values()
            if t.phase == obj.phase and t.id not in before.tasks
        ]
        if rows:
            conn.execute(objective_tasks.insert(), rows)
    return Loaded(obj, last.hash, changed_at)


def request_control(
    conn: Connection,
    objective_id: str,
    body: Mapping[str, Any],
    *,
    at: datetime | None = None,
    organization_id: str | None = None,
    check_organization: bool = False,
    unless_pending: bool = False,
) -> Objective | None:
    """Append ``objective.control_requested`` in the caller's transaction (the outbox write).

    Nothing is written for an objective that does not exist, has ended, or (``check_organization``)
    belongs to another organisation than the job that asks. Returns the objective after the request
    (header only), for the after-commit fast path.
    """
    lock(conn, objective_id)
    loaded = load(conn, objective_id)
    if loaded is None or loaded.objective.terminal:
        return None
    if check_organization and loaded.objective.organization_id != organization_id:
        return None
    if unless_pending and loaded.objective.pending:
        return None  # control is already due (the watchdog's concurrent passes write one request)
    when = at if at is not None else db_now(conn)
    return apply(conn, loaded, objective_id, [("objective.control_requested", dict(body))], at=when).objective


# -- rebuild ------------------------------------------------------------------------------------


def rebuild(conn: Connection) -> int:
    """Drop both projections and re-fold every ``objectives/`` stream. Returns the objective count."""
    conn.execute(delete(objective_tasks))
    conn.execute(delete(objectives))
    count = 0
    for stream in store.streams(conn, OBJECTIVE_STREAM_PREFIX):
        folded = store.fold_stream(conn, stream, fold)
        if folded is None:
            continue
        state = folded.state
        header = _header_columns(state, folded.last.hash, folded.status_changed_at)
        conn.execute(objectives.insert().values(id=state.id, **header))
        rows = [{"objective_id": state.id, "task_id": t.id, **_task_columns(t)} for t in state.tasks.values()]
        if rows:
            conn.execute(objective_tasks.insert(), rows)
        count += 1
    return count
