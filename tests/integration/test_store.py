"""The receipt store on every backend: append, read, the hash chain, verify, append-only."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import select, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError
from sqlalchemy.sql.expression import Executable

from app.composition import queue_for
from app.jobs.errors import AppendConflict
from app.storage import store
from app.storage.db import make_engine, receipts, transaction

APPEND_ONLY = "receipts are append-only"


def independent_hash(stream: str, seq: int, type_: str, body: Any, at: str, prev_hash: str | None) -> str:
    """The spec's hash, written out here without app.storage.store: SHA-256 of sorted, compact UTF-8 JSON."""
    doc = {"stream": stream, "seq": seq, "type": type_, "body": body, "at": at, "prevHash": prev_hash}
    encoded = json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    return hashlib.sha256(encoded).hexdigest()


def iso_of(value: datetime) -> str:
    if value.tzinfo is None:  # SQLite hands back naive UTC
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def append_chain(engine: Engine, stream: str, n: int, **body: Any) -> list[store.StoredReceipt]:
    out: list[store.StoredReceipt] = []
    for i in range(n):
        with transaction(engine) as conn:
            prev = out[-1] if out else None
            out.append(
                store.append(
                    conn,
                    stream,
                    prev.seq if prev else 0,
                    f"t.{i}",
                    {"i": i, **body},
                    prev_hash=prev.hash if prev else None,
                )
            )
    return out


def test_append_read_head(engine: Engine) -> None:
    with transaction(engine) as conn:
        first = store.append(conn, "s/a", 0, "a.one", {"x": 1})
        second = store.append(conn, "s/a", 1, "a.two", {"x": 2})  # prev_hash looked up
        other = store.append(conn, "s/b", 0, "b.one", {})
    assert (first.seq, second.seq, other.seq) == (1, 2, 1)  # per-stream seq starts at 1
    assert first.prev_hash is None and second.prev_hash == first.hash and other.prev_hash is None
    assert first.id < second.id < other.id  # global id is the order of append
    with engine.connect() as conn:
        read = store.read_stream(conn, "s/a")
        assert read == [first, second]
        assert store.read_stream(conn, "s/a", after=1) == [second]
        assert store.read_stream(conn, "s/a", limit=1) == [first]
        assert store.head(conn, "s/a") == second
        assert store.head(conn, "s/missing") is None
        assert store.read_stream(conn, "s/missing") == []
        assert store.streams(conn) == ["s/a", "s/b"]
        assert store.streams(conn, "s/b") == ["s/b"]
        assert [r.id for r in store.iter_all(conn, batch=1)] == [first.id, second.id, other.id]


def test_stream_prefix_is_not_a_pattern(engine: Engine) -> None:
    with transaction(engine) as conn:
        store.append(conn, "jobs/a", 0, "x", {})
        store.append(conn, "jobsXa", 0, "x", {})
        store.append(conn, "jobs%/b", 0, "x", {})
    with engine.connect() as conn:
        assert store.streams(conn, "jobs/") == ["jobs/a"]
        assert store.streams(conn, "jobs%") == ["jobs%/b"]


def test_hash_is_sha256_over_canonical_encoding(engine: Engine) -> None:
    body = {
        "b": [1, 2.5, None, True],
        "a": {"z": "ünïcødé", "y": 'quote"and\\'},
        "big": 10**15,
        "neg": -0.001,
        "e": 1e-7,
    }
    chain = append_chain(engine, "s/h", 3, **body)
    with engine.connect() as conn:
        rows = conn.execute(select(receipts).where(receipts.c.stream == "s/h").order_by(receipts.c.seq)).all()
    prev: str | None = None
    for row, appended in zip(rows, chain, strict=True):
        at = iso_of(row.at)
        assert at == appended.at
        assert row.prev_hash == prev  # prevHash chains
        assert row.hash == independent_hash(row.stream, row.seq, row.type, row.body, at, prev)
        assert row.hash == appended.hash
        prev = row.hash


def test_times_are_database_times_and_ordered(engine: Engine) -> None:
    chain = append_chain(engine, "s/t", 3)
    ats = [r.at for r in chain]
    assert ats == sorted(ats)
    assert all(a.endswith("Z") and len(a) == len("2026-01-01T00:00:00.000000Z") for a in ats)


def test_append_conflict_on_wrong_expected_seq(engine: Engine) -> None:
    append_chain(engine, "s/c", 2)
    for expected in (0, 1):  # behind the head: the seq is taken
        with pytest.raises(AppendConflict), transaction(engine) as conn:
            store.append(conn, "s/c", expected, "late", {})
    with pytest.raises(AppendConflict), transaction(engine) as conn:  # ahead of the head: no prev
        store.append(conn, "s/c", 5, "ahead", {})
    with engine.connect() as conn:
        assert [r.type for r in store.read_stream(conn, "s/c")] == ["t.0", "t.1"]  # nothing overwritten


def test_append_conflict_on_a_concurrent_winner(engine: Engine, database_url: str) -> None:
    """Two writers both read head seq 1; the one that commits second gets AppendConflict."""
    first = append_chain(engine, "s/w", 1)[0]
    other = make_engine(database_url)
    try:
        with transaction(engine) as conn:
            won = store.append(conn, "s/w", 1, "winner", {}, prev_hash=first.hash)
        with pytest.raises(AppendConflict), transaction(other) as conn:
            store.append(conn, "s/w", 1, "loser", {}, prev_hash=first.hash)
    finally:
        other.dispose()
    with engine.connect() as conn:
        assert store.read_stream(conn, "s/w") == [first, won]
        assert store.verify(conn) == (2, None)


def test_verify_ok(engine: Engine) -> None:
    append_chain(engine, "s/1", 4)
    append_chain(engine, "s/2", 3)
    with engine.connect() as conn:
        assert store.verify(conn) == (7, None)
        assert store.verify(conn, stream="s/2") == (3, None)
        assert store.verify(conn, stream="s/none") == (0, None)


# -- tampering: the append-only trigger is bypassed in this test's own database only -----------

Tamper = Callable[[Executable], None]


@pytest.fixture
def tamper(engine: Engine) -> Tamper:
    """Run one statement with the append-only trigger off (in this test's own database only)."""
    with engine.begin() as conn:
        if conn.dialect.name == "sqlite":
            conn.execute(text("DROP TRIGGER receipts_no_update"))
            conn.execute(text("DROP TRIGGER receipts_no_delete"))
        else:
            conn.execute(text("ALTER TABLE receipts DISABLE TRIGGER USER"))

    def run(statement: Executable) -> None:
        with engine.begin() as conn:
            conn.execute(statement)

    return run


def _break_of(engine: Engine, stream: str | None = None) -> store.ChainBreak:
    with engine.connect() as conn:
        _, broken = store.verify(conn, stream=stream)
    assert broken is not None
    return broken


@pytest.mark.own_database  # turns the append-only triggers off
def test_verify_detects_a_tampered_body(engine: Engine, tamper: Tamper) -> None:
    chain = append_chain(engine, "s/x", 3, amount=10)
    append_chain(engine, "s/ok", 2)
    tamper(receipts.update().where(receipts.c.id == chain[1].id).values(body={"i": 1, "amount": 99}))
    broken = _break_of(engine)
    assert (broken.receipt.id, broken.receipt.stream, broken.receipt.seq) == (chain[1].id, "s/x", 2)
    assert "hash" in broken.reason
    with engine.connect() as conn:
        assert store.verify(conn, stream="s/ok") == (2, None)  # other streams still verify


@pytest.mark.own_database  # turns the append-only triggers off
def test_verify_detects_a_broken_prev_hash(engine: Engine, tamper: Tamper) -> None:
    chain = append_chain(engine, "s/p", 3)
    forged = "0" * 64
    # Re-hash the receipt so only the link is wrong, not its own contents.
    r = chain[2]
    tamper(
        receipts.update()
        .where(receipts.c.id == r.id)
        .values(prev_hash=forged, hash=independent_hash(r.stream, r.seq, r.type, r.body, r.at, forged))
    )
    broken = _break_of(engine, "s/p")
    assert (broken.receipt.id, broken.receipt.seq) == (r.id, 3)
    assert "prevHash" in broken.reason


@pytest.mark.own_database  # turns the append-only triggers off
def test_verify_detects_a_gap(engine: Engine, tamper: Tamper) -> None:
    chain = append_chain(engine, "s/g", 3)
    tamper(receipts.delete().where(receipts.c.id == chain[1].id))
    broken = _break_of(engine)
    assert (broken.receipt.id, broken.receipt.seq) == (chain[2].id, 3)
    assert broken.reason == "seq 3 follows seq 1"


@pytest.mark.own_database  # turns the append-only triggers off
def test_verify_detects_a_rewritten_time(engine: Engine, tamper: Tamper) -> None:
    chain = append_chain(engine, "s/time", 2)
    tamper(receipts.update().where(receipts.c.id == chain[0].id).values(at=datetime(2001, 1, 1, tzinfo=UTC)))
    assert _break_of(engine).receipt.id == chain[0].id


# -- append-only, enforced by the database --------------------------------------------------------


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE receipts SET type = 'forged'",
        "UPDATE receipts SET body = '{}'",
        "DELETE FROM receipts",
        "DELETE FROM receipts WHERE seq = 1",
    ],
)
def test_append_only_trigger_rejects_update_and_delete(engine: Engine, statement: str) -> None:
    chain = append_chain(engine, "s/ro", 2)
    with pytest.raises(DBAPIError) as err, engine.begin() as conn:
        conn.execute(text(statement))
    assert APPEND_ONLY in str(err.value)
    with engine.connect() as conn:
        assert store.read_stream(conn, "s/ro") == chain
        assert store.verify(conn) == (2, None)


def test_append_only_trigger_rejects_truncate_on_postgres(pg_engine: Engine) -> None:
    engine = pg_engine
    append_chain(engine, "s/tr", 1)
    with pytest.raises(DBAPIError) as err, engine.begin() as conn:
        conn.execute(text("TRUNCATE receipts"))
    assert APPEND_ONLY in str(err.value)
    with engine.connect() as conn:
        assert store.verify(conn) == (1, None)


def test_a_scan_batch_reads_its_jobs_and_the_clock_together(engine: Engine) -> None:
    """The dispatch scan's claim reads its batch and the database clock in one statement
    (Postgres), in id order, skipping ids that name no job; the clock is not before any of them."""
    from app.jobs.ids import qualify
    from app.jobs.validation import EnqueueRequest
    from app.storage import projection
    from app.storage.db import parse_iso

    queue = queue_for(engine)
    body = {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": "o"}}
    for job_id in ("scan-b", "scan-a"):
        queue.enqueue(EnqueueRequest(agent_id="noop", payload=body, job_id=job_id))
    a, b = qualify("o", "scan-a"), qualify("o", "scan-b")
    with engine.connect() as conn:
        found, now = projection.load_jobs_at_clock(conn, [b, qualify("o", "missing"), a])
        none, clock = projection.load_jobs_at_clock(conn, ["missing"])
    assert [j.id for j in found] == [a, b]
    assert all(now >= parse_iso(j.updated_at) for j in found)  # type: ignore[operator]
    assert none == [] and clock >= now
