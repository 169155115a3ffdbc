"""Receipt benchmarks on PostgreSQL (not a timed test): append throughput and read cost.

(a) Receipt appends per second (``app.storage.store.append``: database clock, SHA-256 hash chain,
    append-only trigger; one transaction per append, one client, the caller tracking each
    stream's head like the queue does) against plain single-row INSERT commits per second into
    a table with the same columns and unique key but no trigger and no hash work.
    Target: ratio >= 0.7.
(b) The cost of reading a job's state (``Queue.get``, which reads the ``jobs`` projection) at
    stream lengths 10, 1,000 and 10,000 receipts. Target: flat, longest/shortest <= 1.5.

Run: ``.venv/bin/python bench/append_bench.py`` (Postgres on 127.0.0.1:5432; override with
``RECEIPT_BENCH_PG_URL``). A fresh database ``receipt_bench_<random>`` is created, migrated and
dropped at the end.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sqlalchemy import (
    JSON,
    BigInteger,
    Column,
    DateTime,
    Integer,
    MetaData,
    String,
    Table,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.jobs.reducer import reduce
from app.jobs.transitions import lease_queued
from app.jobs.validation import validate_enqueue
from app.jobs.vocab import job_stream
from app.storage import projection, store
from app.storage.db import make_engine
from app.storage.migrate import upgrade
from app.storage.queue import Queue
from devharness.databases import new_database

ADMIN_URL = os.environ.get("RECEIPT_BENCH_PG_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres")
APPENDS = int(os.environ.get("RECEIPT_BENCH_APPENDS", "3000"))
STREAMS = 100
ROUNDS = 3
READS = 2000
LENGTHS = (10, 1_000, 10_000)

# The control table: the receipts table's columns and unique key, nothing else.
plain_metadata = MetaData()
plain = Table(
    "bench_plain_inserts",
    plain_metadata,
    Column("id", BigInteger, primary_key=True, autoincrement=True),
    Column("stream", String(512), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("type", String(64), nullable=False),
    Column("body", JSON(), nullable=False),
    Column("at", DateTime(timezone=True), nullable=False),
    Column("prev_hash", String(64), nullable=True),
    Column("hash", String(64), nullable=False),
    UniqueConstraint("stream", "seq"),
)


def _body(i: int) -> dict[str, object]:
    return {"workerId": "bench-worker", "attempt": 1, "progress": {"step": i, "of": APPENDS}}


BLOCK = 100  # receipts and plain inserts alternate in blocks, so machine drift hits both alike


def append_round(engine: Engine, round_no: int) -> tuple[float, float]:
    """One round: (receipt appends/s, plain INSERT commits/s), ``APPENDS`` of each, interleaved.

    Receipts go through app.storage.store.append, one transaction each, the caller tracking every
    stream's head (seq and prevHash) as the queue does; the time is the database clock. The
    plain INSERTs write the same row shape into the control table, also with the database
    clock, but with no hash chain and no append-only trigger.
    """
    heads: dict[str, tuple[int, str | None]] = {}
    seqs: dict[str, int] = {}
    spent_receipts = spent_plain = 0.0
    for block in range(0, APPENDS, BLOCK):
        start = time.perf_counter()
        for i in range(block, min(block + BLOCK, APPENDS)):
            stream = f"bench/{round_no}/{i % STREAMS}"
            seq, prev = heads.get(stream, (0, None))
            with engine.begin() as conn:
                r = store.append(conn, stream, seq, "bench.progress", _body(i), prev_hash=prev)
            heads[stream] = (r.seq, r.hash)
        middle = time.perf_counter()
        for i in range(block, min(block + BLOCK, APPENDS)):
            stream = f"bench/{round_no}/{i % STREAMS}"
            seq = seqs.get(stream, 0) + 1
            with engine.begin() as conn:
                conn.execute(
                    plain.insert().values(
                        stream=stream,
                        seq=seq,
                        type="bench.progress",
                        body=_body(i),
                        at=func.clock_timestamp(),
                        prev_hash=None,
                        hash="-" * 64,
                    )
                )
            seqs[stream] = seq
        spent_receipts += middle - start
        spent_plain += time.perf_counter() - middle
    return APPENDS / spent_receipts, APPENDS / spent_plain


def build_job(engine: Engine, queue: Queue, length: int) -> str:
    """A leased job whose stream holds ``length`` receipts: enqueue, lease, then progress receipts.

    Fast path: the progress receipts go through app.storage.store.append and the reducer in one
    transaction, with the projection written once at the end (projection == fold holds, as in
    the queue). Progress keeps the folded state the same size, so only stream length varies.
    """
    job = queue.enqueue(
        validate_enqueue(
            "codex",
            {
                "payload": {
                    "kind": "factory.task.run",
                    "authContext": {"userId": "bench", "organizationId": "bench"},
                }
            },
        )
    ).job
    leased = queue.mutate(job.id, lambda j, now: lease_queued(j, now, "bench-worker", 3_600_000)).job
    with engine.begin() as conn:
        loaded = projection.load(conn, job.id)
        assert loaded is not None
        state, prev_hash, last = loaded.job, loaded.last_hash, None
        for i in range(length - 2):
            last = store.append(
                conn,
                job_stream(job.id),
                state.seq,
                "job.progress",
                {"workerId": "bench-worker", "attempt": leased.attempt, "progress": {"step": i}},
                prev_hash=prev_hash,
            )
            new = reduce(state, last.to_receipt())
            assert new is not None
            state, prev_hash = new, last.hash
        if last is not None:
            projection.save(conn, state, previous=loaded, last=last)
    got = queue.get(job.id)
    assert got is not None and got.seq == length, (length, got.seq if got else None)
    return job.id


def time_per_call(fn: Callable[[], object], n: int) -> float:
    for _ in range(50):  # warm the pool and the plan cache
        fn()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - start) / n * 1e6


def main() -> int:
    admin = make_engine(ADMIN_URL)
    cleanup = contextlib.ExitStack()
    url = cleanup.enter_context(new_database(admin, "receipt_bench"))
    print(f"$ {os.path.relpath(sys.executable)} {' '.join(sys.argv)}  (database {url})")
    engine = make_engine(url)
    try:
        upgrade(engine)
        plain_metadata.create_all(engine)  # the bench's own control table, not part of the schema
        with engine.connect() as conn:
            version = conn.execute(text("SHOW server_version")).scalar_one()
            sync = conn.execute(text("SHOW synchronous_commit")).scalar_one()
        print(
            f"PostgreSQL {version}, synchronous_commit={sync}; {APPENDS} appends over {STREAMS} streams, "
            f"{ROUNDS} rounds\n"
        )

        print("(a) append throughput, one transaction per write")
        ours, theirs, ratios = [], [], []
        for n in range(ROUNDS):
            a, b = append_round(engine, n)
            ours.append(a)
            theirs.append(b)
            ratios.append(a / b)
            print(f"  round {n + 1}: receipts {a:8.0f}/s   plain INSERT {b:8.0f}/s   ratio {a / b:.2f}")
        with engine.connect() as conn:
            checked, broken = store.verify(conn)
        assert broken is None and checked == APPENDS * ROUNDS
        ratio = statistics.median(ratios)
        print(
            f"  median:  receipts {statistics.median(ours):8.0f}/s   plain INSERT "
            f"{statistics.median(theirs):8.0f}/s   "
            f"ratio {ratio:.2f} (median of the rounds' ratios; target >= 0.70: "
            f"{'met' if ratio >= 0.7 else 'MISSED'})"
        )
        print(f"  all {checked} bench receipts verify (hash chain intact)\n")

        print(
            f"(b) reading a job's state (Queue.get, the jobs projection), {READS} reads per length per round"
        )
        queue = queue_for(engine)
        job_ids = {length: build_job(engine, queue, length) for length in LENGTHS}
        samples: dict[int, list[float]] = {length: [] for length in LENGTHS}
        for n in range(ROUNDS):  # interleaved, order alternating, so drift hits every length alike
            for length in LENGTHS if n % 2 == 0 else LENGTHS[::-1]:
                job_id = job_ids[length]
                samples[length].append(time_per_call(lambda j=job_id: queue.get(j), READS))  # type: ignore[misc]
        costs = {length: statistics.median(v) for length, v in samples.items()}
        for length in LENGTHS:

            def read_whole_stream(j: str = job_ids[length]) -> object:
                with engine.connect() as conn:
                    return store.read_stream(conn, job_stream(j))

            whole = time_per_call(read_whole_stream, 5 if length > 1000 else 50)
            print(
                f"  stream length {length:>6}: {costs[length]:8.1f} µs/read (median of {ROUNDS})"
                f"   for contrast, reading the whole stream: {whole / 1000:8.2f} ms"
            )
        flat = costs[LENGTHS[-1]] / costs[LENGTHS[0]]
        print(f"  ratio longest/shortest: {flat:.2f}  (target <= 1.5: {'met' if flat <= 1.5 else 'MISSED'})")
    finally:
        engine.dispose()
        cleanup.close()  # drops the database
        admin.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
