"""Cost as the work grows: the queue's queries on a database with a long history vs a small one.

    .venv/bin/python -m bench.scale [--finished 1000000] [--queued 10000] [--small-queued 1000] [--reps 200]

Two fresh PostgreSQL databases, both migrated to head:

* **small** — no history, ``--small-queued`` queued jobs (enough that every query returns the
  same number of rows as on the large one: a list page of 50, a redrive batch of 500);
* **large** — ``--finished`` completed jobs and ``--queued`` queued ones.

Jobs are bulk-loaded with ``COPY``: each finished job is the real worker path's four receipts
(``job.enqueued``, ``job.leased`` + ``job.heartbeat`` in one commit, ``job.completed``) with a
valid hash chain, its ``jobs`` projection row is the reducer's fold of those receipts
(``app.jobs.reducer.fold`` and ``app.storage.projection._columns``, so projection == fold holds by
construction), and its settled delivery record. A queued job is one ``job.enqueued`` receipt and
its projection row. Creation times spread over 30 days, queued and finished interleaved (a stuck
backlog is the hard case for a list filtered by status). The receipts table's trigger refuses
UPDATE and DELETE only, so inserting is fine. A sample of streams is re-folded and hash-checked
after the load.

Then each operation runs ``--reps`` times on each database, alternating, and the median is
printed with the ratio large / small (target <= 2x):

* enqueue — ``Queue.enqueue`` (one commit: receipt + projection row);
* dispatch scan — what ``tasks.dispatch.start_driver`` reads per job: the projection row and the
  delivery lookup (``deliveries`` by dispatch key, newest generation), in one transaction,
  rolled back;
* due-retries scan — ``Queue.due_retries`` (the query the due-retries pass runs);
* queued redrive — ``Queue.queued_older_than`` (the redrive pass's query, 500 a batch);
* lease expiry — ``Queue.expire_leases`` with no lease past due (its scan query only);
* list — ``Queue.list_jobs(organization_id=…, status="queued")``, the query behind
  ``GET /jobs?status=queued``;
* job read — ``Queue.get`` of a random job (behind ``GET /jobs/<id>``).

``--explain`` prints the EXPLAIN (ANALYZE, BUFFERS) plan of each scan query on the large database.
The databases are dropped at the end (``--keep`` keeps them and prints their URLs).
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from contextlib import ExitStack
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.engine import Engine

from app.jobs.reducer import Receipt, fold
from app.jobs.validation import validate_enqueue
from app.jobs.vocab import job_stream
from app.storage import projection
from app.storage.db import deliveries, iso, make_engine
from app.storage.delivery import driver_task_id
from app.storage.migrate import upgrade
from app.storage.queue import Queue
from app.storage.store import receipt_hash
from bench.runtime_bench import fresh_database, log

ORGS = 10
AGENT = "noop"
WORKER = "bench-host:1:0"
SPREAD = timedelta(days=30)
CHUNK = 20_000
RECEIPT_COLUMNS = ("stream", "seq", "type", "body", "at", "prev_hash", "hash")
DELIVERY_COLUMNS: tuple[str, ...] = (
    *("dispatch_key", "generation", "job_id", "task_id", "state", "outcome", "created_at"),
    *("deadline_at", "settled_at"),
)
NULL = "\\N"


def org(i: int) -> str:
    return f"bench-org-{i % ORGS}"


def enqueue_body(job_id: str, organization: str) -> dict[str, Any]:
    return {
        "jobId": job_id,
        "agentId": AGENT,
        "lane": "collect",
        "payload": {
            "kind": "factory.run",
            "authContext": {"userId": "bench", "organizationId": organization},
        },
        "sessionKey": None,
        "singletonMode": "allow",
        "maxAttempts": 3,
    }


def _cell(value: Any) -> Any:
    if value is None:
        return NULL
    if isinstance(value, bool):
        return "t" if value else "f"
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, dict | list):
        return json.dumps(value, separators=(",", ":"))
    return value


class Loader:
    """Builds one chunk of rows per table as CSV and COPYs it in."""

    def __init__(self) -> None:
        self.job_columns: list[str] = []
        self.reset()

    def reset(self) -> None:
        self.receipts = io.StringIO()
        self.jobs = io.StringIO()
        self.deliveries = io.StringIO()
        self._r = csv.writer(self.receipts)
        self._j = csv.writer(self.jobs)
        self._d = csv.writer(self.deliveries)

    def job(self, job_id: str, organization: str, created: datetime, finished: bool) -> None:
        stream = job_stream(job_id)
        steps: list[tuple[str, dict[str, Any], datetime]] = [
            ("job.enqueued", enqueue_body(job_id, organization), created)
        ]
        if finished:
            started = created + timedelta(milliseconds=5)
            fence = {"workerId": WORKER, "attempt": 1, "expiresAt": iso(started + timedelta(minutes=10))}
            steps += [
                ("job.leased", fence, started),
                ("job.heartbeat", dict(fence), started),
                ("job.completed", {"workerId": WORKER, "attempt": 1, "result": {}}, started),
            ]
        prev: str | None = None
        state = None
        changed_at = created
        for seq, (type_, body, at) in enumerate(steps, start=1):
            at_text = iso(at)
            assert at_text is not None
            digest = receipt_hash(stream, seq, type_, body, at_text, prev)
            self._r.writerow([_cell(v) for v in (stream, seq, type_, body, at_text, prev, digest)])
            before = state.status if state else None
            state = fold([Receipt(stream=stream, seq=seq, type=type_, body=body, at=at_text)], state)
            assert state is not None
            if state.status != before:
                changed_at = at
            prev = digest
        assert state is not None and prev is not None
        row = {"id": job_id, **projection._columns(state, prev, changed_at)}
        if not self.job_columns:
            self.job_columns = list(row)
        self._j.writerow([_cell(row[c]) for c in self.job_columns])
        if finished:
            done = created + timedelta(milliseconds=6)
            values = (job_id, 0, job_id, driver_task_id(job_id, 0), "settled", "dispatched", created)
            self._d.writerow([_cell(v) for v in (*values, created + timedelta(minutes=2), done)])

    def flush(self, engine: Engine) -> None:
        raw = engine.raw_connection()
        try:
            cur = raw.cursor()
            opts = f"WITH (FORMAT csv, NULL '{NULL}')"
            for table, columns, buf in (
                ("receipts", RECEIPT_COLUMNS, self.receipts),
                ("jobs", tuple(self.job_columns), self.jobs),
                ("deliveries", DELIVERY_COLUMNS, self.deliveries),
            ):
                buf.seek(0)
                if columns:
                    cur.copy_expert(f"COPY {table} ({', '.join(columns)}) FROM STDIN {opts}", buf)
            raw.commit()
        finally:
            raw.close()
        self.reset()


def seed(engine: Engine, finished: int, queued: int, rng: random.Random) -> None:
    """Bulk-load ``finished`` completed and ``queued`` queued jobs, interleaved over 30 days."""
    total = finished + queued
    kinds = [True] * finished + [False] * queued
    rng.shuffle(kinds)
    end = datetime.now(UTC) - timedelta(hours=1)
    start = end - SPREAD
    step = SPREAD / max(total, 1)
    loader = Loader()
    started = time.monotonic()
    for i, is_finished in enumerate(kinds):
        loader.job(f"seed-{i:08d}", org(i), start + step * i, is_finished)
        if (i + 1) % CHUNK == 0:
            loader.flush(engine)
            if (i + 1) % (CHUNK * 10) == 0:
                log(f"  seeded {i + 1}/{total} jobs ({time.monotonic() - started:.0f} s)")
    loader.flush(engine)
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        # VACUUM too: otherwise autovacuum picks the freshly loaded tables up while they are timed.
        conn.execute(text("VACUUM (ANALYZE)"))
    log(f"  seeded {total} jobs in {time.monotonic() - started:.0f} s")


def check_sample(engine: Engine, rng: random.Random, total: int) -> None:
    """Re-fold and hash-check a sample of seeded streams: projection == fold, chain intact."""
    from app.storage import store

    with engine.connect() as conn:
        for i in rng.sample(range(total), min(50, total)):
            job_id = f"seed-{i:08d}"
            checked, broken = store.verify(conn, stream=job_stream(job_id))
            assert checked and broken is None, f"{job_id}: chain {broken}"
            folded = fold(r.to_receipt() for r in store.read_stream(conn, job_stream(job_id)))
            loaded = projection.load(conn, job_id)
            assert folded is not None and loaded is not None and folded == loaded.job, job_id


# -- the operations timed ----------------------------------------------------------------------


def operations(engine: Engine, queue: Queue, total: int, rng: random.Random) -> dict[str, Callable[[], Any]]:
    counter = iter(range(10**9))

    def enqueue() -> None:
        i = next(counter)
        queue.enqueue(
            validate_enqueue(
                AGENT,
                {
                    "jobId": f"timed-{os.getpid()}-{i:08d}",
                    "payload": {
                        "kind": "factory.run",
                        "authContext": {"userId": "b", "organizationId": org(i)},
                    },
                },
            )
        )

    def dispatch_scan() -> None:
        job_id = f"seed-{rng.randrange(total):08d}"
        with engine.connect() as conn:
            projection.load(conn, job_id)
            conn.execute(
                select(deliveries.c.generation, deliveries.c.state, deliveries.c.deadline_at)
                .where(deliveries.c.dispatch_key == job_id)
                .order_by(deliveries.c.generation.desc())
                .limit(1)
            ).first()
            conn.rollback()

    return {
        "enqueue": enqueue,
        "dispatch scan (job + delivery lookup)": dispatch_scan,
        "due-retries scan": lambda: queue.due_retries(),
        "queued redrive (500 a batch)": lambda: queue.queued_older_than(1000),
        "lease expiry scan": lambda: queue.expire_leases(),
        "GET /jobs?status=queued (list query)": lambda: queue.list_jobs(
            organization_id=org(rng.randrange(ORGS)), status="queued"
        ),
        "job read (GET /jobs/<id>)": lambda: queue.get(f"seed-{rng.randrange(total):08d}"),
    }


EXPLAINED = {
    "list": "SELECT state, created_at, id FROM jobs WHERE organization_id = 'bench-org-3' AND status = "
    "'queued' ORDER BY created_at DESC, id DESC LIMIT 51",
    "redrive": "SELECT state, status_changed_at FROM jobs WHERE status = 'queued' AND "
    "coalesce(available_at, status_changed_at) <= now() - interval '1 second' "
    "ORDER BY coalesce(available_at, status_changed_at) LIMIT 500",
    "lease expiry": "SELECT id FROM jobs WHERE status IN ('leased', 'running') AND lease_expires_at < now() "
    "ORDER BY lease_expires_at LIMIT 500",
    "due retries": "SELECT state FROM jobs WHERE status = 'queued' AND available_at IS NOT NULL AND "
    "available_at <= now() ORDER BY available_at LIMIT 500",
}


def explain(engine: Engine) -> None:
    with engine.connect() as conn:
        for name, sql in EXPLAINED.items():
            plan = conn.execute(text(f"EXPLAIN (ANALYZE, BUFFERS) {sql}")).scalars().all()
            print(f"\n-- {name}\n" + "\n".join(f"   {line}" for line in plan))


def time_ops(
    ops: dict[str, dict[str, Callable[[], Any]]], reps: int, deadline: float
) -> dict[str, dict[str, float]]:
    """Median ms of each operation per database; databases alternate op by op, rep by rep."""
    samples: dict[str, dict[str, list[float]]] = {db: {name: [] for name in o} for db, o in ops.items()}
    names = list(next(iter(ops.values())))
    for rep in range(reps):
        order = list(ops) if rep % 2 == 0 else list(reversed(ops))
        for name in names:
            for db in order:
                t0 = time.perf_counter()
                ops[db][name]()
                samples[db][name].append((time.perf_counter() - t0) * 1000)
        if time.monotonic() > deadline:
            log(f"  time budget reached after {rep + 1} repetitions")
            break
    return {db: {n: statistics.median(v) for n, v in per.items()} for db, per in samples.items()}


INDEXES_0006 = ("ix_jobs_org_status_created", "ix_jobs_queued_since")


def print_table(title: str, medians: dict[str, dict[str, float]]) -> None:
    print(f"  {title}:")
    print(f"    {'operation':<42} {'small ms':>9} {'large ms':>9} {'ratio':>7}   (target <= 2.0)")
    for name in medians["small"]:
        s, lg = medians["small"][name], medians["large"][name]
        print(f"    {name:<42} {s:9.2f} {lg:9.2f} {lg / s:7.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scale")
    parser.add_argument("--finished", type=int, default=1_000_000)
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--small-queued", type=int, default=1_000)
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--budget-s", type=float, default=300, help="stop timing after this many seconds")
    parser.add_argument("--explain", action="store_true")
    parser.add_argument(
        "--before-0006",
        action="store_true",
        help="then drop migration 0006's indexes and time again (the before/after table)",
    )
    parser.add_argument("--seed", type=int, default=12)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    load = os.getloadavg()
    with ExitStack() as stack:
        engines: dict[str, Engine] = {}
        queues: dict[str, Queue] = {}
        for name, finished, queued in (
            ("small", 0, args.small_queued),
            ("large", args.finished, args.queued),
        ):
            url = stack.enter_context(fresh_database(f"scale_{name}"))
            engine = make_engine(url)
            stack.callback(engine.dispose)
            upgrade(engine)
            log(f"{name}: seeding {finished} finished + {queued} queued jobs")
            seed(engine, finished, queued, rng)
            check_sample(engine, rng, finished + queued)
            engines[name] = engine
            queues[name] = Queue(engine)
        ops = {
            name: operations(engines[name], queues[name], n, rng)
            for name, n in (("small", args.small_queued), ("large", args.finished + args.queued))
        }
        for o in ops.values():  # warm every pool and cache once
            for fn in o.values():
                fn()
        log(f"timing {len(ops['small'])} operations, {args.reps} repetitions each, alternating databases")
        medians = time_ops(ops, args.reps, time.monotonic() + args.budget_s)
        with engines["large"].connect() as conn:
            sizes = conn.execute(
                text("SELECT (SELECT count(*) FROM receipts), (SELECT count(*) FROM jobs)")
            ).one()
            disk = conn.execute(
                text(
                    "SELECT pg_total_relation_size('receipts'), pg_total_relation_size('jobs'), "
                    "pg_total_relation_size('deliveries')"
                )
            ).one()
        print()
        print(
            f"Scale benchmark: small = {args.small_queued} queued, no history; large = {args.finished} "
            f"finished + {args.queued} queued ({sizes[0]} receipts, {sizes[1]} jobs rows); "
            f"load average before the run {load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}"
        )
        per_job = [b / max(sizes[1], 1) for b in disk]
        print(
            f"  on disk per job (tables + indexes): receipts {per_job[0]:.0f} B, jobs {per_job[1]:.0f} B, "
            f"deliveries {per_job[2]:.0f} B; total {sum(disk) / 2**20:.0f} MiB"
        )
        print_table("with migration 0006's indexes", medians)
        if args.before_0006:
            for engine in engines.values():
                with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                    for index in INDEXES_0006:
                        conn.execute(text(f"DROP INDEX {index}"))
                    conn.execute(text("ANALYZE jobs"))
            log("dropped migration 0006's indexes; timing again")
            before = time_ops(ops, args.reps, time.monotonic() + args.budget_s)
            print_table("without them (before migration 0006)", before)
        if args.explain:
            explain(engines["large"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
