"""Tombstones: what the live database keeps of a stream the archiving pass moved out.

Read by every path that must know an id is taken (an enqueue, a read of a job or objective) and
written only by the archiving pass (``app/retention/archive.py``), under its guard.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.engine import Connection

from app.jobs.errors import JobArchived
from app.storage.db import archive_guard, archived_streams, as_utc, is_sqlite, iso

# PostgreSQL: the transaction-local setting the receipts trigger reads (migration 0010).
GUARD_SETTING = "receipt.archiving"


@dataclass(frozen=True)
class Tombstone:
    """One archived stream: who it was, how it ended, and where its receipts went."""

    stream: str
    kind: str
    key: str
    organization_id: str | None
    status: str
    receipt_count: int
    final_hash: str
    ended_at: datetime
    segment: str
    pass_id: str
    archived_at: datetime
    summary: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        """The summary a client is answered with, and where the history went."""
        return {
            **self.summary,
            "status": self.status,
            "archived": True,
            "archive": {
                "stream": self.stream,
                "segment": self.segment,
                "receiptCount": self.receipt_count,
                "finalHash": self.final_hash,
                "archivedAt": iso(self.archived_at),
            },
        }

    def refusal(self) -> JobArchived:
        return JobArchived(self.key, self.to_json())


def _row(r: Any) -> Tombstone:
    return Tombstone(
        stream=r.stream,
        kind=r.kind,
        key=r.key,
        organization_id=r.organization_id,
        status=r.status,
        receipt_count=int(r.receipt_count),
        final_hash=r.final_hash,
        ended_at=as_utc(r.ended_at),
        segment=r.segment,
        pass_id=r.pass_id,
        archived_at=as_utc(r.archived_at),
        summary=r.summary,
    )


def find(conn: Connection, stream: str) -> Tombstone | None:
    row = conn.execute(select(archived_streams).where(archived_streams.c.stream == stream)).first()
    return _row(row) if row is not None else None


def find_many(conn: Connection, streams: Iterable[str]) -> dict[str, Tombstone]:
    wanted = list(dict.fromkeys(streams))
    if not wanted:
        return {}
    rows = conn.execute(select(archived_streams).where(archived_streams.c.stream.in_(wanted)))
    return {r.stream: _row(r) for r in rows}


def in_segment(conn: Connection, segment: str) -> list[Tombstone]:
    rows = conn.execute(select(archived_streams).where(archived_streams.c.segment == segment))
    return [_row(r) for r in rows]


def iter_all(conn: Connection, *, batch: int = 1000) -> Iterable[Tombstone]:
    """Every tombstone, in stream order, paged."""
    after = ""
    while True:
        rows = conn.execute(
            select(archived_streams)
            .where(archived_streams.c.stream > after)
            .order_by(archived_streams.c.stream)
            .limit(batch)
        ).all()
        if not rows:
            return
        for r in rows:
            yield _row(r)
        after = rows[-1].stream


def segments(conn: Connection) -> set[str]:
    return {r[0] for r in conn.execute(select(archived_streams.c.segment).distinct())}


def set_guard(conn: Connection, pass_id: str) -> None:
    """Open the archiving pass's guard for the rest of this transaction."""
    if is_sqlite(conn):
        conn.execute(archive_guard.insert().values(pass_id=pass_id))
    else:
        conn.execute(
            text("SELECT set_config(:name, :value, true)"), {"name": GUARD_SETTING, "value": pass_id}
        )


def clear_guard(conn: Connection, pass_id: str) -> None:
    """Close it before commit (PostgreSQL's setting ends with the transaction by itself)."""
    if is_sqlite(conn):
        conn.execute(archive_guard.delete().where(archive_guard.c.pass_id == pass_id))
    else:
        conn.execute(text("SELECT set_config(:name, '', true)"), {"name": GUARD_SETTING})
