"""The receipt store: a small set of named operations over the append-only ``receipts`` table.

Every operation takes the caller's connection, so the caller owns the transaction (a receipt
and its projection row commit together). Appends are optimistic: the writer states the seq it
expects to follow; losing the race raises ``AppendConflict`` and the caller re-reads.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, Protocol, TypeVar

from sqlalchemy import column, func, select, values
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError

from app.jobs.errors import AppendConflict
from app.jobs.reducer import Receipt
from app.storage.db import as_utc, db_now, iso, parse_iso, receipts
from app.storage.direct import DirectMany, multi_row_params, multi_row_values


@dataclass(frozen=True)
class StoredReceipt:
    """A receipt as stored: its global id, stream position, time and hash chain."""

    id: int
    stream: str
    seq: int
    type: str
    body: Mapping[str, Any]
    at: str
    prev_hash: str | None
    hash: str

    def to_receipt(self) -> Receipt:
        return Receipt(stream=self.stream, seq=self.seq, type=self.type, body=self.body, at=self.at)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "stream": self.stream,
            "seq": self.seq,
            "type": self.type,
            "body": self.body,
            "at": self.at,
            "prevHash": self.prev_hash,
            "hash": self.hash,
        }


def canonical(value: Any) -> bytes:
    """Deterministic JSON: sorted keys, no whitespace, UTF-8."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode()


def receipt_hash(stream: str, seq: int, type_: str, body: Any, at: str, prev_hash: str | None) -> str:
    """SHA-256 over the canonical encoding of (stream, seq, type, body, time, prevHash)."""
    return hashlib.sha256(
        canonical(
            {"stream": stream, "seq": seq, "type": type_, "body": body, "at": at, "prevHash": prev_hash}
        )
    ).hexdigest()


# Built once: constructing the statement per append costs more CPU than executing it.
_INSERT = receipts.insert().returning(receipts.c.id, sort_by_parameter_order=True)
_COLUMNS = ("stream", "seq", "type", "body", "at", "prev_hash", "hash")


def _insert_rows(n: int) -> Any:
    """One INSERT of ``n`` receipts (parameters ``<column>_<i>``), returning each id with its seq."""
    return (
        receipts.insert()
        .values(multi_row_values((receipts.c[c] for c in _COLUMNS), n))
        .returning(receipts.c.id, receipts.c.seq)
    )


def insert_when(n: int, condition: Any) -> Any:
    """``_insert_rows(n)`` as ``INSERT … SELECT … FROM (VALUES …) WHERE condition``: the rows
    go in only when ``condition`` holds (a transition whose projection row moved, projection.py)."""
    columns = [receipts.c[c] for c in _COLUMNS]
    rows = values(*(column(c.key, c.type) for c in columns), name="chained").data(
        [tuple(row[c.key] for c in columns) for row in multi_row_values(columns, n)]
    )
    return (
        receipts.insert()
        .from_select(list(_COLUMNS), select(*rows.c).where(condition))
        .returning(receipts.c.id, receipts.c.seq)
    )


# PostgreSQL: the same INSERT as one multi-row statement on the driver's cursor (app/storage/direct.py).
_INSERT_ROWS = DirectMany(_insert_rows, limit=8)


def append(
    conn: Connection,
    stream: str,
    expected_seq: int,
    type_: str,
    body: Mapping[str, Any],
    *,
    prev_hash: str | None = None,
    at: datetime | None = None,
) -> StoredReceipt:
    """Append after ``expected_seq`` (0 for a new stream).

    ``prev_hash`` may be passed by a caller that already holds the stream head (saves a read);
    otherwise it is looked up. Raises ``AppendConflict`` if another writer got there first.
    """
    [stored] = append_many(conn, stream, expected_seq, [(type_, body)], prev_hash=prev_hash, at=at)
    return stored


def append_many(
    conn: Connection,
    stream: str,
    expected_seq: int,
    events: Sequence[tuple[str, Mapping[str, Any]]],
    *,
    prev_hash: str | None = None,
    at: datetime | None = None,
) -> list[StoredReceipt]:
    """Append receipts after ``expected_seq`` in one statement (one round trip), chained in order.

    ``prev_hash`` and ``at`` as for ``append``: looked up (the stream head, the database clock)
    when the caller does not hold them. Raises ``AppendConflict`` if another writer got there first.
    """
    if expected_seq > 0 and prev_hash is None:
        prev_hash = conn.execute(
            select(receipts.c.hash).where(receipts.c.stream == stream, receipts.c.seq == expected_seq)
        ).scalar_one_or_none()
        if prev_hash is None:
            raise AppendConflict(f"{stream}: no receipt at seq {expected_seq}")
    chained = chain(
        stream, expected_seq, events, prev_hash=prev_hash, at=at if at is not None else db_now(conn)
    )
    return chained.stored(insert(conn, chained))


@dataclass(frozen=True)
class Chained:
    """Receipts hashed into their stream's chain, in order, not yet written (no ids)."""

    stream: str
    at: str
    rows: list[dict[str, Any]]  # the ``receipts`` columns of each

    @property
    def last_hash(self) -> str:
        return str(self.rows[-1]["hash"])

    def receipts(self) -> list[Receipt]:
        """What a reducer folds (a receipt's id plays no part in any state)."""
        return [Receipt(self.stream, r["seq"], r["type"], r["body"], self.at) for r in self.rows]

    def stored(self, ids: Sequence[int]) -> list[StoredReceipt]:
        """The receipts as written, given their ids in order."""
        return [
            StoredReceipt(
                int(i), self.stream, r["seq"], r["type"], r["body"], self.at, r["prev_hash"], r["hash"]
            )
            for i, r in zip(ids, self.rows, strict=True)
        ]


def chain(
    stream: str,
    expected_seq: int,
    events: Sequence[tuple[str, Mapping[str, Any]]],
    *,
    prev_hash: str | None,
    at: datetime,
) -> Chained:
    """Hash ``events`` into the chain after ``expected_seq`` (whose hash is ``prev_hash``), all
    at ``at`` (pure: the caller writes them, with ``insert`` or in a statement of its own)."""
    when = as_utc(at)
    at_text = iso(when)
    assert at_text is not None
    rows: list[dict[str, Any]] = []
    for type_, body in events:
        seq = expected_seq + 1
        body_dict = dict(body)
        digest = receipt_hash(stream, seq, type_, body_dict, at_text, prev_hash)
        rows.append(
            {
                "stream": stream,
                "seq": seq,
                "type": type_,
                "body": body_dict,
                "at": when,
                "prev_hash": prev_hash,
                "hash": digest,
            }
        )
        expected_seq, prev_hash = seq, digest
    return Chained(stream, at_text, rows)


T = TypeVar("T")


def advance(
    stream: str,
    state: T | None,
    after: tuple[int, str | None],
    events: Sequence[tuple[str, Mapping[str, Any]]],
    reduce: Callable[[T | None, Receipt], T | None],
    *,
    at: datetime,
) -> tuple[Chained, T]:
    """The step every stream takes before its writes: hash ``events`` into the chain ``after``
    (the head's seq and hash; ``(0, None)`` for a new stream) and fold them into ``state`` with the
    stream's reducer. Pure: the caller writes the receipts (``insert``, or a statement of its own)
    and its projection row together. ``AppendConflict`` when there is nothing to apply or the
    reducer refuses the receipts."""
    if not events:
        raise AppendConflict(f"{stream}: nothing to apply")
    chained = chain(stream, after[0], events, prev_hash=after[1], at=at)
    for receipt in chained.receipts():
        state = reduce(state, receipt)
    if state is None:
        raise AppendConflict(f"{stream}: the receipts fold to no state")
    return chained, state


def insert(conn: Connection, chained: Chained) -> list[int]:
    """Write chained receipts in one statement; their ids, in order. ``AppendConflict`` when
    another writer took one of their seqs first."""
    rows = chained.rows
    try:
        # No savepoint: a conflict aborts the caller's transaction, which re-reads and re-decides.
        direct = _INSERT_ROWS.for_rows(len(rows))
        if not direct.available(conn):
            return [int(i) for i in conn.execute(_INSERT, list(rows)).scalars().all()]
        # Each row's seq is unique within the statement, so ids are matched by seq, not by the
        # order RETURNING happens to produce.
        id_of = {int(seq): int(new_id) for new_id, seq in direct.rows(conn, multi_row_params(rows))}
    except IntegrityError as exc:
        raise AppendConflict(f"{chained.stream}: seq {rows[0]['seq']} already taken") from exc
    return [id_of[row["seq"]] for row in rows]


def _row(r: Any) -> StoredReceipt:
    at = iso(r.at)
    assert at is not None
    return StoredReceipt(int(r.id), r.stream, int(r.seq), r.type, r.body, at, r.prev_hash, r.hash)


def read_stream(
    conn: Connection, stream: str, *, after: int = 0, limit: int | None = None
) -> list[StoredReceipt]:
    """Receipts of one stream with seq > ``after``, in order."""
    q = select(receipts).where(receipts.c.stream == stream, receipts.c.seq > after).order_by(receipts.c.seq)
    if limit is not None:
        q = q.limit(limit)
    return [_row(r) for r in conn.execute(q)]


class _HasStatus(Protocol):
    @property
    def status(self) -> str: ...


S = TypeVar("S", bound=_HasStatus)


@dataclass(frozen=True)
class Folded(Generic[S]):
    """A whole stream folded: the state, its last receipt and when the status last changed."""

    state: S
    last: StoredReceipt
    status_changed_at: datetime


def fold_stream(
    conn: Connection, stream: str, fold: Callable[[Iterable[Receipt], S | None], S | None]
) -> Folded[S] | None:
    """Fold ``stream`` from its first receipt with ``fold`` (a job's or an objective's reducer),
    as a projection rebuild needs it; None for an empty or unfoldable stream."""
    state: S | None = None
    changed_at: datetime | None = None
    last: StoredReceipt | None = None
    for r in read_stream(conn, stream):
        before = state.status if state is not None else None
        state = fold([r.to_receipt()], state)
        last = r
        if state is not None and state.status != before:
            changed_at = parse_iso(r.at)
    if state is None or last is None or changed_at is None:
        return None
    return Folded(state, last, changed_at)


def head(conn: Connection, stream: str) -> StoredReceipt | None:
    """The last receipt of a stream."""
    r = conn.execute(
        select(receipts).where(receipts.c.stream == stream).order_by(receipts.c.seq.desc()).limit(1)
    ).first()
    return _row(r) if r is not None else None


def streams(conn: Connection, prefix: str = "") -> list[str]:
    """Every stream name (optionally under a prefix), in first-append order."""
    q = select(receipts.c.stream, func.min(receipts.c.id).label("first")).group_by(receipts.c.stream)
    if prefix:
        q = q.where(receipts.c.stream.startswith(prefix, autoescape=True))
    return [r.stream for r in conn.execute(q.order_by("first"))]


def iter_all(conn: Connection, *, stream: str | None = None, batch: int = 1000) -> Iterator[StoredReceipt]:
    """Every receipt in global append order (optionally of one stream), paged by id."""
    last = 0
    while True:
        q = select(receipts).where(receipts.c.id > last).order_by(receipts.c.id).limit(batch)
        if stream is not None:
            q = q.where(receipts.c.stream == stream)
        rows = [_row(r) for r in conn.execute(q)]
        if not rows:
            return
        yield from rows
        last = rows[-1].id


@dataclass(frozen=True)
class ChainBreak:
    """The first receipt whose chain does not verify, and why."""

    receipt: StoredReceipt
    reason: str


def verify(conn: Connection, *, stream: str | None = None) -> tuple[int, ChainBreak | None]:
    """Recompute every chain (or one stream's). Returns (receipts checked, first break or None)."""
    heads: dict[str, tuple[int, str | None]] = {}
    checked = 0
    for r in iter_all(conn, stream=stream):
        seq_before, hash_before = heads.get(r.stream, (0, None))
        if r.seq != seq_before + 1:
            return checked, ChainBreak(r, f"seq {r.seq} follows seq {seq_before}")
        if r.prev_hash != hash_before:
            return checked, ChainBreak(r, "prevHash does not match the previous receipt's hash")
        expected = receipt_hash(r.stream, r.seq, r.type, r.body, r.at, r.prev_hash)
        if expected != r.hash:
            return checked, ChainBreak(r, "hash does not match the receipt's contents")
        heads[r.stream] = (r.seq, r.hash)
        checked += 1
    return checked, None
