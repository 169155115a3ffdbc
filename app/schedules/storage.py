"""The schedules' storage seam: ``schedules/<organizationId>/<id>`` streams and their projection.

Every write takes the caller's connection (the caller owns the transaction, so a schedule's receipts,
its row and the jobs its ticks enqueue commit together) and is made on rows the caller locked
(``load(for_update=True)``, ``due``): one schedule is one short critical section, and a pass never
waits for a schedule an API call holds (``SKIP LOCKED``: it is the next pass's). The projection row
carries what the pass scans: ``next_fire_at`` (the next tick after the cursor, NULL when paused,
deleted or past its end) and ``buffered``. ``rebuild`` re-folds every stream from receipts alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import (
    and_,
    delete,
    or_,
    select,
)
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.sql.elements import ColumnElement

from app.jobs.errors import AppendConflict
from app.jobs.ids import KEY_SEPARATOR, qualify
from app.jobs.times import iso
from app.schedules.reducer import Schedule, fold, reduce
from app.schedules.ticks import next_tick
from app.schedules.vocab import SCHEDULE_STREAM_PREFIX, TICK_EVENTS, schedule_stream
from app.storage import bulk, keyset, store
from app.storage.db import is_sqlite, parse_iso, receipts, schedules

Event = tuple[str, Mapping[str, Any]]


@dataclass(frozen=True)
class Loaded:
    """A schedule as read from its row, with the stream head needed to append after it."""

    schedule: Schedule
    last_hash: str


def key_of(organization_id: str, schedule_id: str) -> str | None:
    """The storage key of the schedule an organisation knows as ``schedule_id``."""
    if KEY_SEPARATOR in schedule_id:
        return None  # a client id never holds the separator
    return qualify(organization_id, schedule_id)


def next_fire_at(s: Schedule) -> datetime | None:
    """When ``s``'s next tick is due: the first after its cursor; None when it will not tick."""
    if not s.active:
        return None
    cursor = parse_iso(s.cursor)
    assert cursor is not None
    return next_tick(s.spec.timing, cursor)


# -- reads ------------------------------------------------------------------------------------------


def _loaded(row: Any) -> Loaded:
    return Loaded(Schedule.from_json(row.state), row.last_hash)


def load(conn: Connection, key: str, *, for_update: bool = False) -> Loaded | None:
    q = select(schedules.c.state, schedules.c.last_hash).where(schedules.c.id == key)
    if for_update and not is_sqlite(conn):
        q = q.with_for_update()
    row = conn.execute(q).first()
    return _loaded(row) if row is not None else None


def due(
    conn: Connection, now: datetime, limit: int, *, buffered: bool = False, lead_ms: int = 0
) -> list[Loaded]:
    """Active schedules whose next tick is at or before ``now`` (an ``allow`` one's: ``lead_ms`` after
    it, ``plan.horizon``), soonest first (``buffered``: those holding a buffered tick instead),
    locked for this transaction. A row another transaction holds is skipped (PostgreSQL), not
    waited for: the next pass takes it."""
    c = schedules.c
    cond: ColumnElement[bool]
    if buffered:
        cond = c.buffered.is_(True)
    elif lead_ms > 0:
        ahead = and_(
            c.next_fire_at <= now + timedelta(milliseconds=lead_ms),
            c.state["spec"]["overlap"].as_string() == "allow",
        )
        cond = or_(c.next_fire_at <= now, ahead)
    else:
        cond = c.next_fire_at <= now
    q = (
        select(c.state, c.last_hash)
        .where(c.status == "active", cond)
        .order_by(c.next_fire_at, c.id)
        .limit(limit)
    )
    if not is_sqlite(conn):
        q = q.with_for_update(skip_locked=True)
    return [_loaded(r) for r in conn.execute(q).all()]


@dataclass(frozen=True)
class Page:
    schedules: list[Schedule]
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
    """Schedules newest first (deleted ones only when asked for by status), keyset-paged."""
    c = schedules.c
    q = select(c.state, c.created_at, c.id)
    if not all_organizations:
        q = q.where(c.organization_id == organization_id)
    q = q.where(c.status == status) if status is not None else q.where(c.status != "deleted")
    rows, next_cursor = keyset.page(
        conn.execute(keyset.newest_first(q, c.created_at, c.id, cursor, limit)).all(), limit
    )
    return Page([Schedule.from_json(r.state) for r in rows], next_cursor)


def tick_receipts(conn: Connection, key: str, *, before: int | None, limit: int) -> list[store.StoredReceipt]:
    """A page of the schedule's tick receipts (fired, missed, skipped, buffered), newest first."""
    r = receipts.c
    q = select(receipts).where(r.stream == schedule_stream(key), r.type.in_(TICK_EVENTS))
    if before is not None:
        q = q.where(r.seq < before)
    rows = conn.execute(q.order_by(r.seq.desc()).limit(limit)).all()
    return [
        store.StoredReceipt(int(x.id), x.stream, x.seq, x.type, x.body, _iso(x.at), x.prev_hash, x.hash)
        for x in rows
    ]


def _iso(at: datetime) -> str:
    text = iso(at)
    assert text is not None
    return text


# -- writes -----------------------------------------------------------------------------------------


def _columns(s: Schedule, last_hash: str) -> dict[str, Any]:
    return {
        "organization_id": s.organization_id,
        "status": s.status,
        "next_fire_at": next_fire_at(s),
        "buffered": s.buffered_tick is not None,
        "created_at": parse_iso(s.created_at),
        "updated_at": parse_iso(s.updated_at),
        "last_seq": s.seq,
        "last_hash": last_hash,
        "state": s.to_json(),
    }


def apply(
    conn: Connection, loaded: Loaded | None, key: str, events: Sequence[Event], *, at: datetime
) -> Loaded:
    """Append ``events`` to one schedule after ``loaded`` and write its row."""
    [done] = apply_many(conn, [(loaded, key, events)], at=at)
    return done


def apply_many(
    conn: Connection, items: Sequence[tuple[Loaded | None, str, Sequence[Event]]], *, at: datetime
) -> list[Loaded]:
    """Append each schedule's receipts after its loaded head and write its row: every receipt in one
    multi-row INSERT, the new rows in another, the changed rows in one UPDATE (PostgreSQL). The rows
    were locked by the caller; a stream another writer moved still conflicts on its seq
    (``AppendConflict``), and the caller's transaction then rolls back whole."""
    out: list[Loaded] = []
    rows: list[dict[str, Any]] = []
    new: list[dict[str, Any]] = []
    changed: list[tuple[int, dict[str, Any]]] = []
    for loaded, key, events in items:
        chained, state = store.advance(
            schedule_stream(key),
            loaded.schedule if loaded else None,
            (loaded.schedule.seq, loaded.last_hash) if loaded else (0, None),
            events,
            reduce,
            at=at,
        )
        rows.extend(chained.rows)
        columns = _columns(state, chained.last_hash)
        if loaded is None:
            new.append({"id": key, **columns})
        else:
            changed.append((loaded.schedule.seq, {"id": key, **columns}))
        out.append(Loaded(state, chained.last_hash))
    try:
        bulk.insert(conn, receipts, rows)
        bulk.insert(conn, schedules, new)
    except IntegrityError as exc:
        raise AppendConflict(
            f"{len(items)} schedules: a stream moved, or one was created, meanwhile"
        ) from exc
    if changed:
        _update_rows(conn, changed)
    return out


_UPDATED = (
    "organization_id",
    "status",
    "next_fire_at",
    "buffered",
    "created_at",
    "updated_at",
    "last_seq",
    "last_hash",
    "state",
)


def _update_rows(conn: Connection, changed: Sequence[tuple[int, dict[str, Any]]]) -> None:
    """The changed rows, each where it still is at the seq it was read at (one statement)."""
    items = [((row["id"], seq), {k: row[k] for k in _UPDATED}) for seq, row in changed]
    moved = len(items) - bulk.update(conn, schedules, ("id", "last_seq"), items)
    if moved:
        raise AppendConflict(f"{moved} schedule rows moved past the seq they were read at")


def refresh_next_fire(conn: Connection, stale: Sequence[Loaded]) -> None:
    """Write each schedule's ``next_fire_at`` again from its state (a derived column, nothing else)."""
    items = [((x.schedule.id, x.schedule.seq), {"next_fire_at": next_fire_at(x.schedule)}) for x in stale]
    bulk.update(conn, schedules, ("id", "last_seq"), items)


# -- rebuild ----------------------------------------------------------------------------------------


def rebuild(conn: Connection) -> int:
    """Drop every schedule row and re-fold every ``schedules/`` stream. Returns the schedule count."""
    conn.execute(delete(schedules))
    count = 0
    for stream in store.streams(conn, SCHEDULE_STREAM_PREFIX):
        folded = store.fold_stream(conn, stream, fold)
        if folded is None:
            continue
        row = _columns(folded.state, folded.last.hash)
        conn.execute(schedules.insert().values(id=folded.state.id, **row))
        count += 1
    return count
