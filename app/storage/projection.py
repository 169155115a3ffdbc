"""The ``jobs`` projection: each job's folded state, written in the receipt's own transaction.

It must equal the fold of the job's stream at all times; ``rebuild`` recreates it from
receipts alone (``receipt rebuild-projections``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import String, and_, any_, bindparam, delete, exists, func, literal, or_, select, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import ColumnElement

from app.jobs.errors import AppendConflict
from app.jobs.ids import SYSTEM_ORGANIZATION
from app.jobs.reducer import Job, fold
from app.jobs.routing import queue_for
from app.jobs.vocab import JOB_STREAM_PREFIX, job_id_of, job_stream
from app.storage import bulk, store
from app.storage.db import (
    ERROR_TEXT_LENGTH,
    archived_streams,
    as_utc,
    db_now,
    is_sqlite,
    job_tags,
    jobs,
    parse_iso,
)
from app.storage.db import receipts as receipts_table
from app.storage.direct import Direct, multi_row_params
from app.storage.store import StoredReceipt, fold_stream, streams


@dataclass(frozen=True)
class Loaded:
    """A job as read from the projection, with the stream head needed to append after it."""

    job: Job
    last_hash: str
    status_changed_at: datetime


def load(conn: Connection, job_id: str, *, for_update: bool = False) -> Loaded | None:
    q = select(jobs.c.state, jobs.c.last_hash, jobs.c.status_changed_at).where(jobs.c.id == job_id)
    if for_update and conn.dialect.name != "sqlite":
        q = q.with_for_update()
    row = conn.execute(q).first()
    if row is None:
        return None
    return Loaded(Job.from_json(row.state), row.last_hash, as_utc(row.status_changed_at))


def load_jobs(conn: Connection, job_ids: Sequence[str]) -> list[Job]:
    """The jobs among ``job_ids`` that exist, in one read (a dispatch scan's batch, a schedules
    page's new keys). PostgreSQL: the ids as one array parameter (``= ANY``), so a page of 500 ids
    is one statement text, not an ``IN`` list of 500 parameters to build."""
    if not job_ids:
        return []
    if not is_sqlite(conn):
        return [Job.from_json(state) for (state,) in _LOAD_JOBS.rows(conn, {"job_ids": list(job_ids)})]
    rows = conn.execute(select(jobs.c.state).where(jobs.c.id.in_(list(job_ids))).order_by(jobs.c.id)).all()
    return [Job.from_json(r.state) for r in rows]


# Built once (hot path): the projection row and the database clock in one round trip. The clock is
# evaluated after the statement's snapshot is taken, so it is later than every receipt that
# snapshot shows; a receipt committed after it makes the caller's append conflict (and re-read).
# The row is the one with the key, or else a bare key of the same organisation (``legacy_owned``).
_ONE = select(literal(1).label("one")).subquery()


def legacy_owned(key: Any, bare: Any, organization_id: Any) -> ColumnElement[bool]:
    """The row ``key`` names, or the bare-keyed row of ``bare`` when it is the organisation's
    (written before keys were qualified; a bare system job has no organisation recorded)."""
    return or_(
        jobs.c.id == key,
        and_(
            jobs.c.id == bare,
            func.coalesce(jobs.c.organization_id, SYSTEM_ORGANIZATION) == organization_id,
        ),
    )


_AT_CLOCK = select(
    func.clock_timestamp().label("now"), jobs.c.state, jobs.c.last_hash, jobs.c.status_changed_at
)
_LOAD_AT_CLOCK = Direct(_AT_CLOCK.select_from(_ONE.outerjoin(jobs, jobs.c.id == bindparam("job_id"))))
_LOAD_IN_AT_CLOCK = Direct(
    _AT_CLOCK.select_from(
        _ONE.outerjoin(jobs, legacy_owned(bindparam("job_id"), bindparam("bare"), bindparam("org")))
    ).limit(1)  # never two: an organisation's bare id is found, so never qualified again
)


# An enqueue's read: the same, plus whether the key's stream was archived (its tombstone), in the
# same statement and snapshot: the pass removes the row and writes the tombstone in one commit.
_ARCHIVED = exists(select(archived_streams.c.stream).where(archived_streams.c.stream == bindparam("stream")))
_LOAD_FOR_ENQUEUE = Direct(
    _AT_CLOCK.add_columns(_ARCHIVED.label("archived")).select_from(
        _ONE.outerjoin(jobs, jobs.c.id == bindparam("job_id"))
    )
)
_LOAD_IN_FOR_ENQUEUE = Direct(
    _AT_CLOCK.add_columns(_ARCHIVED.label("archived"))
    .select_from(_ONE.outerjoin(jobs, legacy_owned(bindparam("job_id"), bindparam("bare"), bindparam("org"))))
    .limit(1)
)


_LOAD_JOBS = Direct(
    select(jobs.c.state)
    .where(jobs.c.id == any_(bindparam("job_ids", type_=ARRAY(String))))
    .order_by(jobs.c.id)
)


# What routes woken jobs to their line (a dispatch scan's batch): the same array parameter as
# ``_LOAD_JOBS``, so the statement is prepared once whatever the batch's size.
_LOAD_ROUTES = Direct(
    select(jobs.c.id, jobs.c.agent_id, jobs.c.kind, jobs.c.status, jobs.c.worker_queue).where(
        jobs.c.id == any_(bindparam("job_ids", type_=ARRAY(String)))
    )
)


def load_routes(conn: Connection, job_ids: Sequence[str]) -> list[tuple[str, str, str, str, str | None]]:
    """(id, agent id, kind, status, worker queue) of the jobs among ``job_ids`` that exist."""
    if not job_ids:
        return []
    if not is_sqlite(conn):
        return [tuple(row) for row in _LOAD_ROUTES.rows(conn, {"job_ids": list(job_ids)})]
    cols = (jobs.c.id, jobs.c.agent_id, jobs.c.kind, jobs.c.status, jobs.c.worker_queue)
    return [tuple(row) for row in conn.execute(select(*cols).where(jobs.c.id.in_(list(job_ids)))).all()]


def load_jobs_at_clock(conn: Connection, job_ids: Sequence[str]) -> tuple[list[Job], datetime]:
    """``load_jobs`` and the database clock, read together (Postgres: one statement)."""
    if is_sqlite(conn) or not job_ids:
        return load_jobs(conn, job_ids), db_now(conn)
    heads, now = load_many_at_clock(conn, job_ids)
    return [head.job for head in heads.values()], now


# The rows among many ids with each one's stream head, and the clock, in one statement (PostgreSQL
# only: the ids as one array parameter, ``= ANY``, so the statement text never varies).
_LOAD_HEADS_AT_CLOCK = Direct(
    _AT_CLOCK.select_from(
        _ONE.outerjoin(jobs, jobs.c.id == any_(bindparam("job_ids", type_=ARRAY(String))))
    ).order_by(jobs.c.id)
)


def load_many_at_clock(conn: Connection, job_ids: Sequence[str]) -> tuple[dict[str, Loaded], datetime]:
    """The jobs among ``job_ids`` that exist, each with its stream head, and the database clock,
    read together (PostgreSQL: one statement): what a transaction deciding for several jobs at once
    appends after. Ordered by id, as ``load_jobs``."""
    if is_sqlite(conn) or not job_ids:
        found = {job_id: load(conn, job_id) for job_id in sorted(set(job_ids))}
        return {k: v for k, v in found.items() if v is not None}, db_now(conn)
    rows = _LOAD_HEADS_AT_CLOCK.rows(conn, {"job_ids": list(dict.fromkeys(job_ids))})
    heads = {}
    for _now, state, last_hash, changed_at in rows:
        if state is not None:
            job = Job.from_json(state)
            heads[job.id] = Loaded(job, last_hash, as_utc(changed_at))
    return heads, as_utc(rows[0][0])


def load_in(conn: Connection, key: str, organization_id: str, bare: str | None) -> Loaded | None:
    """The job with ``key``, or else the organisation's bare-keyed job ``bare`` (see ``legacy_owned``)."""
    if bare is None:
        return load(conn, key)
    row = conn.execute(
        select(jobs.c.state, jobs.c.last_hash, jobs.c.status_changed_at).where(
            legacy_owned(key, bare, organization_id)
        )
    ).first()  # never two: an organisation's bare id is found, so never qualified again
    if row is None:
        return None
    return Loaded(Job.from_json(row.state), row.last_hash, as_utc(row.status_changed_at))


def load_at_clock(
    conn: Connection, job_id: str, organization_id: str | None = None, bare: str | None = None
) -> tuple[Loaded | None, datetime]:
    """``load`` (or ``load_in`` when ``bare`` is given) and the database clock, read together
    (Postgres: one statement).

    For a transaction that decides from this one job only: its receipts may take this time.
    """
    if is_sqlite(conn):
        found = load(conn, job_id) if bare is None else load_in(conn, job_id, organization_id or "", bare)
        return found, db_now(conn)
    if bare is None:
        [(now_, state, last_hash, status_changed_at)] = _LOAD_AT_CLOCK.rows(conn, {"job_id": job_id})
    else:
        [(now_, state, last_hash, status_changed_at)] = _LOAD_IN_AT_CLOCK.rows(
            conn, {"job_id": job_id, "bare": bare, "org": organization_id}
        )
    now = as_utc(now_)
    if state is None:
        return None, now
    return Loaded(Job.from_json(state), last_hash, as_utc(status_changed_at)), now


def load_for_enqueue(
    conn: Connection, job_id: str, organization_id: str, bare: str | None
) -> tuple[Loaded | None, datetime, bool]:
    """``load_at_clock`` for an enqueue, and whether ``job_id``'s stream was archived (PostgreSQL:
    one statement)."""
    if is_sqlite(conn):
        found, now = load_at_clock(conn, job_id, organization_id, bare)
        archived = conn.execute(select(_ARCHIVED), {"stream": job_stream(job_id)}).scalar_one()
        return found, now, bool(archived)
    params: dict[str, Any] = {"job_id": job_id, "stream": job_stream(job_id)}
    if bare is None:
        [(now_, state, last_hash, status_changed_at, archived)] = _LOAD_FOR_ENQUEUE.rows(conn, params)
    else:
        params.update(bare=bare, org=organization_id)
        [(now_, state, last_hash, status_changed_at, archived)] = _LOAD_IN_FOR_ENQUEUE.rows(conn, params)
    now = as_utc(now_)
    if state is None:
        return None, now, bool(archived)
    return Loaded(Job.from_json(state), last_hash, as_utc(status_changed_at)), now, bool(archived)


# Built once (hot path): an optimistic update of one job's row at the seq it was read at.
_INSERT = Direct(jobs.insert())
_UPDATE = Direct(update(jobs).where(jobs.c.id == bindparam("b_id"), jobs.c.last_seq == bindparam("b_seq")))


def error_text(error: Any) -> str | None:
    """The text a search by error prefix matches: a string error itself, or an object error's
    ``message``; its first ``ERROR_TEXT_LENGTH`` characters. None for no error or another shape."""
    if isinstance(error, Mapping):
        error = error.get("message")
    if not isinstance(error, str) or not error:
        return None
    return error[:ERROR_TEXT_LENGTH]


def _columns(job: Job, last_hash: str, status_changed_at: datetime) -> dict[str, Any]:
    lease = job.lease
    created = parse_iso(job.created_at)
    updated = parse_iso(job.updated_at)
    return {
        "organization_id": job.organization_id,
        "agent_id": job.agent_id,
        "lane": job.lane,
        "kind": job.kind[:64],
        "status": job.status,
        "session_key": job.session_key,
        "attempt": job.attempt,
        "max_attempts": job.max_attempts,
        "lease_worker_id": lease.worker_id if lease else None,
        "lease_attempt": lease.attempt if lease else None,
        "lease_expires_at": parse_iso(lease.expires_at) if lease else None,
        "abort_requested": job.abort_requested,
        "created_at": created,
        "updated_at": updated,
        "status_changed_at": status_changed_at,
        "available_at": parse_iso(job.available_at),
        "last_seq": job.seq,
        "last_hash": last_hash,
        "state": job.to_json(),
        "tags": dict(job.tags) if job.tags else None,
        "error_text": error_text(job.error),
        # What the dispatch pass reads (docs/dispatch.md); the route only while the job may still run.
        "worker_queue": None if job.terminal else queue_for(job.agent_id, job.kind),
        "priority": job.flow.priority,
        "concurrency_key": job.flow.concurrency_key,
        "concurrency_limit": job.flow.concurrency_limit,
        "debounce_key": job.flow.debounce.key if job.flow.debounce is not None else None,
    }


# The columns ``_columns`` sets, named once for the statements that bind them one by one.
PROJECTED_COLUMNS = (
    "organization_id",
    "agent_id",
    "lane",
    "kind",
    "status",
    "session_key",
    "attempt",
    "max_attempts",
    "lease_worker_id",
    "lease_attempt",
    "lease_expires_at",
    "abort_requested",
    "created_at",
    "updated_at",
    "status_changed_at",
    "available_at",
    "last_seq",
    "last_hash",
    "state",
    "tags",
    "error_text",
    "worker_queue",
    "priority",
    "concurrency_key",
    "concurrency_limit",
    "debounce_key",
)


def _projected(names: Sequence[str]) -> dict[str, Any]:
    return {c: bindparam(f"j_{c}", type_=jobs.c[c].type) for c in names}


@functools.lru_cache(maxsize=64)
def _transition(n: int, new: bool, companion: Direct | None, unseen: bool = False) -> Direct:
    """One statement for a transition: the projection's INSERT (``new``) or UPDATE in a
    data-modifying CTE, then the ``n`` receipts -- inserted only if the row was written -- and
    ``companion`` (an UPDATE of the same transition, e.g. the deliveries it ends) under the same
    condition. Returns each receipt's id and seq; no rows when the projection had moved on, and
    then nothing at all was written, which matters when the statement is its own transaction.
    ``unseen``: a new job written without reading first (``Unseen``): its row is inserted only
    while its id is neither archived nor a legacy row of its organisation's."""
    if new and unseen:
        names = ("id", *PROJECTED_COLUMNS)
        binds = _projected(names)
        taken = exists(
            select(jobs.c.id).where(legacy_owned(binds["id"], bindparam("u_bare"), bindparam("u_org")))
        )
        write: Any = jobs.insert().from_select(list(names), select(*binds.values()).where(~_ARCHIVED, ~taken))
    elif new:
        write = jobs.insert().values(_projected(("id", *PROJECTED_COLUMNS)))
    else:
        write = (
            update(jobs)
            .where(jobs.c.id == bindparam("b_id"), jobs.c.last_seq == bindparam("b_seq"))
            .values(_projected(PROJECTED_COLUMNS))
        )
    moved = write.returning(jobs.c.id).cte("moved")
    written = exists(select(moved.c.id))
    statement = store.insert_when(n, written).add_cte(moved)
    if companion is not None:
        also = companion.statement.where(written)  # type: ignore[attr-defined]
        statement = statement.add_cte(also.cte("companion"))
    return Direct(statement)


@dataclass(frozen=True)
class Unseen:
    """A new job about to be written with no read of its id first: the organisation and the bare
    id (a client id from before keys were qualified; None for none) its write must not shadow."""

    organization_id: str
    bare: str | None


def append_and_save(
    conn: Connection,
    job: Job,
    *,
    previous: Loaded | None,
    chained: store.Chained,
    companion: tuple[Direct, Mapping[str, Any]] | None = None,
    unseen: Unseen | None = None,
) -> tuple[Loaded, list[StoredReceipt]]:
    """Write ``chained`` (the receipts ``job`` is the fold after) and the projection row after
    them, and run ``companion`` (a statement and its parameters) beside them. PostgreSQL: one
    statement (``_transition``), so a transition is one round trip and, alone on an autocommit
    connection, its own transaction; SQLite: ``store.insert``, ``save``, then the companion.
    ``AppendConflict`` as for ``store.insert`` and ``save``, with nothing written."""
    if not Direct.available(conn):
        stored = chained.stored(store.insert(conn, chained))
        loaded = save(conn, job, previous=previous, last=stored[-1])
        if companion is not None:
            companion[0].count(conn, companion[1])
        return loaded, stored
    changed_at = _status_changed_at(job, previous, chained.at)
    params = {f"j_{k}": v for k, v in _columns(job, chained.last_hash, changed_at).items()}
    params.update(multi_row_params(chained.rows))
    guarded = previous is None and unseen is not None
    if previous is None:
        params["j_id"] = job.id
    else:
        params.update(b_id=job.id, b_seq=previous.job.seq)
    if guarded:
        assert unseen is not None
        params.update(stream=job_stream(job.id), u_bare=unseen.bare, u_org=unseen.organization_id)
    if companion is not None:
        params.update(companion[1])
    statement = _transition(len(chained.rows), previous is None, companion[0] if companion else None, guarded)
    try:
        rows = statement.rows(conn, params)
    except IntegrityError as exc:
        raise AppendConflict(f"{chained.stream}: seq {chained.rows[0]['seq']} already taken") from exc
    if not rows:
        if guarded:
            raise AppendConflict(f"{job_stream(job.id)}: archived, or named by an older job")
        assert previous is not None
        raise AppendConflict(f"{job_stream(job.id)}: projection moved past seq {previous.job.seq}")
    id_of = {int(seq): int(new_id) for new_id, seq in rows}
    return Loaded(job, chained.last_hash, changed_at), chained.stored([id_of[r["seq"]] for r in chained.rows])


def insert_new(conn: Connection, created: Sequence[tuple[Job, store.Chained]]) -> None:
    """Write many new jobs at once: each one's first receipts and its projection row, as two
    statements whatever their number (``bulk.insert``; a schedules pass enqueues a page of fires
    this way: one round trip per table, not two per job). ``AppendConflict`` when another writer
    created one of them first; the caller's transaction then rolls back whole and re-decides."""
    if not created:
        return
    receipts = [row for _job, chained in created for row in chained.rows]
    rows = []
    for job, chained in created:
        changed = parse_iso(chained.at)
        assert changed is not None
        rows.append({"id": job.id, **_columns(job, chained.last_hash, changed)})
    try:
        bulk.insert(conn, receipts_table, receipts)
        bulk.insert(conn, jobs, rows)
    except IntegrityError as exc:
        raise AppendConflict(f"{len(created)} new jobs: one was created by another writer first") from exc


def advance_many(conn: Connection, moved: Sequence[tuple[Loaded, Job, store.Chained]]) -> list[Loaded]:
    """Append to many existing jobs at once: each one's receipts (``chained``, after ``previous``)
    and its projection row at the seq it was read at, as two statements whatever their number
    (``bulk.insert``, ``bulk.update``). ``AppendConflict`` when any of them moved meanwhile; the
    caller's transaction then rolls back whole and re-decides."""
    if not moved:
        return []
    receipts = [row for _prev, _job, chained in moved for row in chained.rows]
    rows = []
    heads = []
    for previous, job, chained in moved:
        changed_at = _status_changed_at(job, previous, chained.at)
        rows.append(((job.id, previous.job.seq), _columns(job, chained.last_hash, changed_at)))
        heads.append(Loaded(job, chained.last_hash, changed_at))
    try:
        bulk.insert(conn, receipts_table, receipts)
    except IntegrityError as exc:
        raise AppendConflict(f"{len(moved)} jobs: another writer appended to one first") from exc
    if bulk.update(conn, jobs, ("id", "last_seq"), rows) != len(rows):
        raise AppendConflict(f"{len(moved)} jobs: a projection row moved meanwhile")
    return heads


def advance_unlocked(
    conn: Connection, moved: Sequence[tuple[Loaded, Job, store.Chained]]
) -> dict[str, Loaded]:
    """``advance_many`` as one statement (PostgreSQL), with no transaction around it: each job's
    row where it still is at the seq it was read at, and in the same statement the receipts of
    only those rows (``bulk.update_with_children``). A job that moved meanwhile gets nothing. The
    heads written, by job id; ``AppendConflict`` (nothing written) when a receipt's seq was taken."""
    if not moved:
        return {}
    rows = []
    heads = {}
    children = []
    for previous, job, chained in moved:
        changed_at = _status_changed_at(job, previous, chained.at)
        rows.append(((job.id, previous.job.seq), _columns(job, chained.last_hash, changed_at)))
        heads[job.id] = Loaded(job, chained.last_hash, changed_at)
        children += [(job.id, row) for row in chained.rows]
    try:
        written = bulk.update_with_children(conn, jobs, ("id", "last_seq"), rows, receipts_table, children)
    except IntegrityError as exc:
        raise AppendConflict(f"{len(moved)} jobs: another writer appended to one first") from exc
    return {job_id: head for job_id, head in heads.items() if job_id in written}


def _status_changed_at(job: Job, previous: Loaded | None, at: str) -> datetime:
    """When ``job`` (the fold after receipts written at ``at``) last changed status."""
    if previous is not None and previous.job.status == job.status:
        return previous.status_changed_at
    changed = parse_iso(at)
    assert changed is not None
    return changed


def save(conn: Connection, job: Job, *, previous: Loaded | None, last: StoredReceipt) -> Loaded:
    """Write the projection row for ``job`` after ``last`` (the receipt just appended)."""
    changed_at = _status_changed_at(job, previous, last.at)
    if previous is None:
        _INSERT.count(conn, {"id": job.id, **_columns(job, last.hash, changed_at)})
    else:
        updated = _UPDATE.count(
            conn, {"b_id": job.id, "b_seq": previous.job.seq, **_columns(job, last.hash, changed_at)}
        )
        if updated != 1:
            raise AppendConflict(f"{job_stream(job.id)}: projection moved past seq {previous.job.seq}")
    return Loaded(job, last.hash, changed_at)


def rebuild(conn: Connection) -> int:
    """Drop every projection row and re-fold every ``jobs/`` stream. Returns the job count.

    ``job_tags`` is rebuilt with it: emptied here, and refilled from each row's tags by the
    database as the row is written (its trigger, migration 0013)."""
    conn.execute(delete(job_tags))
    conn.execute(delete(jobs))
    count = 0
    for stream in streams(conn, JOB_STREAM_PREFIX):
        row = row_of_stream(conn, stream)
        if row is not None:
            conn.execute(jobs.insert().values(row))
            count += 1
    return count


def row_of_stream(conn: Connection, stream: str) -> dict[str, Any] | None:
    """The projection row a job's whole stream folds to (None for an empty or unfoldable one)."""
    folded = fold_stream(conn, stream, fold)
    if folded is None:
        return None
    return {"id": job_id_of(stream), **_columns(folded.state, folded.last.hash, folded.status_changed_at)}
