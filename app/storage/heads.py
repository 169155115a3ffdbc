"""Stream heads in one statement: what the API's shared event-stream poller asks each tick.

A job's and an objective's head seq come from their projections (``jobs.last_seq``,
``objectives.last_seq``), written in the very transaction that appends the receipt, so they are
never behind a committed receipt; any other stream (``tokens/...``) from the receipts' own
``(stream, seq)`` index. The same statement says which of the given tokens still authenticate,
so a poller tick is one round trip however many streams and tokens are open.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime

from sqlalchemy import DateTime, Integer, String, cast, func, literal, null, select, union_all
from sqlalchemy.engine import Connection
from sqlalchemy.sql import ColumnElement, Select

from app.jobs.vocab import JOB_STREAM_PREFIX
from app.storage.db import api_tokens, as_utc, jobs, objectives, receipts

# Objective streams are named here rather than imported: storage does not depend on the Factory.
OBJECTIVE_PREFIX = "objectives/"


@dataclass(frozen=True)
class Heads:
    """Each stream's head seq (absent: the stream has no receipt) and the tokens still live."""

    seqs: dict[str, int]
    live_tokens: frozenset[str]


def read(
    conn: Connection, streams: Collection[str], token_ids: Collection[str], now: datetime | None = None
) -> Heads:
    """The heads of ``streams`` and which of ``token_ids`` are live, in one statement."""
    job_ids = sorted({s[len(JOB_STREAM_PREFIX) :] for s in streams if s.startswith(JOB_STREAM_PREFIX)})
    objective_ids = sorted({s[len(OBJECTIVE_PREFIX) :] for s in streams if s.startswith(OBJECTIVE_PREFIX)})
    others = sorted({s for s in streams if not s.startswith((JOB_STREAM_PREFIX, OBJECTIVE_PREFIX))})
    parts: list[Select[str, str, int, datetime]] = []
    if job_ids:
        parts.append(_row("j", jobs.c.id, jobs.c.last_seq).where(jobs.c.id.in_(job_ids)))
    if objective_ids:
        parts.append(
            _row("o", objectives.c.id, objectives.c.last_seq).where(objectives.c.id.in_(objective_ids))
        )
    if others:
        parts.append(
            _row("r", receipts.c.stream, func.max(receipts.c.seq))
            .where(receipts.c.stream.in_(others))
            .group_by(receipts.c.stream)
        )
    if token_ids:
        # Expiry is compared here, as ``tokens.is_live`` does: SQLite keeps datetimes as text.
        parts.append(
            _row("t", api_tokens.c.id, null(), api_tokens.c.expires_at).where(
                api_tokens.c.id.in_(sorted(set(token_ids))), api_tokens.c.revoked_at.is_(None)
            )
        )
    if not parts:
        return Heads({}, frozenset())
    statement = parts[0] if len(parts) == 1 else union_all(*parts)
    seqs: dict[str, int] = {}
    live: set[str] = set()
    moment = now or datetime.now(UTC)
    for kind, name, seq, expires_at in conn.execute(statement):
        if kind == "t":
            if expires_at is None or as_utc(expires_at) > moment:
                live.add(name)
        elif kind == "j":
            seqs[JOB_STREAM_PREFIX + name] = int(seq or 0)
        elif kind == "o":
            seqs[OBJECTIVE_PREFIX + name] = int(seq or 0)
        else:
            seqs[name] = int(seq or 0)
    return Heads(seqs, frozenset(live))


def _row(
    kind: str,
    name: ColumnElement[str],
    seq: ColumnElement[int] | ColumnElement[None],
    expires_at: ColumnElement[datetime] | None = None,
) -> Select[str, str, int, datetime]:
    """One row shape for every part of the union: (kind, name, head seq, token expiry)."""
    return select(
        literal(kind, String).label("kind"),
        cast(name, String).label("name"),
        cast(seq, Integer).label("seq"),
        (expires_at if expires_at is not None else cast(null(), DateTime(timezone=True))).label("expires_at"),
    )
