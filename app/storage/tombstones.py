"""Tombstones: what the live database keeps of a stream the archiving pass moved out.

Read by every path that must know an id is taken (an enqueue, a read of a job or objective) and
written only by the archiving pass (``app/retention/archive.py``), under its guard.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.engine import Connection

from app.jobs.errors import JobArchived
from app.jobs.ids import client_id_of
from app.storage.db import archive_guard, archive_segments, archived_streams, as_utc, is_sqlite, iso

# PostgreSQL: the transaction-local setting the receipts trigger reads (migration 0011).
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
        # The summary holds what no column does (agent, kind, times...): the id, organisation and
        # status are the tombstone's own columns.
        return {
            "id": client_id_of(self.key),
            "organizationId": self.organization_id,
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


def by_segment(conn: Connection) -> Iterator[tuple[str, dict[str, Tombstone]]]:
    """Every tombstone, grouped by the segment it names, in segment order (one sorted scan,
    streamed: the archive's verification merges it with the segments, also sorted)."""
    q = select(archived_streams).order_by(archived_streams.c.segment, archived_streams.c.stream)
    current: str | None = None
    group: dict[str, Tombstone] = {}
    for r in conn.execute(q.execution_options(yield_per=2000)):
        if r.segment != current:
            if current is not None:
                yield current, group
            current, group = r.segment, {}
        group[r.stream] = _row(r)
    if current is not None:
        yield current, group


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


def committed_segments(conn: Connection) -> set[str]:
    """The segments whose tombstones committed (``archive_segments``, written in their transaction)."""
    return {r[0] for r in conn.execute(select(archive_segments.c.segment))}


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
