"""Cost as the work grows: the queue's queries on a database with a long history vs a small one.

    .venv/bin/python -m bench.scale [--finished 1000000] [--queued 10000] [--small-queued 1000] [--reps 200]

Two fresh PostgreSQL databases, both migrated to head:

* **small** — no history, ``--small-queued`` queued jobs (enough that every query returns the
  same number of rows as on the large one: a list page of 50, a redrive batch of 500);
* **large** — ``--finished`` completed jobs and ``--queued`` queued ones.

Jobs are bulk-loaded with ``COPY``: each finished job is the real worker path's four receipts
(``job.enqueued``, ``job.leased`` + ``job.heartbeat`` in one commit, ``job.completed``) with a
valid hash chain, its ``jobs`` projection row is the reducer's fold of those receipts, and its
settled delivery record; a queued job is one ``job.enqueued`` receipt and its projection row.
Creation times spread over 30 days, queued and finished interleaved (a stuck backlog is the hard
case for a list filtered by status). The receipts table's trigger refuses UPDATE, DELETE and
TRUNCATE only, so inserting is fine.

Seeding speed (1,010,000 jobs in about two minutes on 2 cores): ``job_rows`` builds a job the
obvious way (``receipt_hash`` per receipt, ``app.jobs.reducer.fold``,
``app.storage.projection._columns``), but only once per kind, for a prototype job; ``Template``
turns those rows into format strings whose fields are the job id, organisation, times and
hashes, and ``fill`` renders each job from them, computing every receipt's SHA-256 over its
canonical text (which holds the previous hash). A separate process renders chunks while this one
COPYs the previous chunk in over two connections (receipts on one, projection rows and
deliveries on the other), ``synchronous_commit`` off for the load. Kept honest by two checks that
fail the run: before loading, ``fill`` must equal ``job_rows`` for 200 sample jobs of each kind;
after it, the row counts must add up and 1,000 random jobs are re-read, hash-verified
(``store.verify``) and re-folded, every projection column compared with the fold
(``check_sample``).

Then each operation runs ``--reps`` times on each database, alternating, and the median is
printed with the ratio large / small (target <= 2x):

* enqueue — ``Queue.enqueue`` (one commit: receipt + projection row);
* dispatch scan — what ``delivery.dispatch.start_driver`` reads for one queued job: ``Queue.get``,
  then in one transaction the clock, the job's delivery lock, its pending deliveries and the
  key's last generation (``delivery.begin``), rolled back instead of inserting;
* dispatch claim, batch of 50 — the batched claim's shape: in one transaction the projection
  rows of 50 queued jobs (``id = ANY``), each job's delivery lock, their pending deliveries and
  last generations, and one multi-row insert of 50 pending deliveries; rolled back;
* due-retries scan — ``Queue.due_retries`` as the due-retries pass calls it (in-flight
  deliveries left out);
* queued redrive — ``Queue.queued_older_than`` as the redrive pass calls it (500 a batch,
  in-flight deliveries left out);
* lease expiry — ``Queue.expire_leases`` with no lease past due (its scan query only);
* list — ``Queue.list_jobs(organization_id=…, status="queued")``, the query behind
  ``GET /jobs?status=queued``;
* job read — ``Queue.get`` of a random job (behind ``GET /jobs/<id>``).

``--before-0006`` then drops migration 0006's two indexes and times again (the before/after
table); ``--explain`` prints the EXPLAIN (ANALYZE, BUFFERS) plan of each scan query on the large
database. The databases are dropped at the end.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import io
import json
import multiprocessing
import os
import random
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import select, text
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.jobs.reducer import Receipt, fold
from app.jobs.validation import validate_enqueue
from app.jobs.vocab import job_stream
from app.storage import delivery, projection, store
from app.storage.db import db_now, iso, jobs, make_engine
from app.storage.delivery import driver_task_id
from app.storage.migrate import current, upgrade
from app.storage.queue import Queue
from app.storage.store import canonical, receipt_hash
from bench.runtime_bench import fresh_database, log

ORGS = 10
AGENT = "noop"
WORKER = "bench-host:1:0"
SPREAD = timedelta(days=30)
CHUNK = 20_000
RECEIPT_COLUMNS = ("stream", "seq", "type", "body", "at", "prev_hash", "hash")
DELIVERY_COLUMNS: tuple[str, ...] = (
    *("job_id", "purpose", "observed", "generation", "dispatch_key", "task_id", "state", "outcome"),
    *("created_at", "deadline_at", "settled_at"),
)
NULL = "\\N"
# The prototype a template is rendered from: values that occur nowhere else in a job's rows, so
# each can be replaced by a format field (the id is as long as a seed id, seed-%08d).
PROTO_ID = "seed-PROTOTYP"
PROTO_ORG = "bench-org-PROTO"
PROTO_AT = datetime(2001, 2, 3, 4, 5, 6, 123456, tzinfo=UTC)
SELF_CHECKED = 200  # jobs of each kind rendered both ways before the load; they must be equal
CHECKED = 1_000  # seeded jobs re-folded and hash-verified after the load


def org(i: int) -> str:
    return f"bench-org-{i % ORGS}"


def seed_id(i: int) -> str:
    return f"seed-{i:08d}"


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


def moments(created: datetime) -> dict[str, datetime]:
    """Every time a seeded job's rows hold, from its creation time."""
    started = created + timedelta(milliseconds=5)
    return {
        "created": created,
        "started": started,  # leased, first heartbeat and completed in the same millisecond
        "expires": started + timedelta(minutes=10),
        "settled": created + timedelta(milliseconds=6),  # its delivery record
        "deadline": created + timedelta(minutes=2),
    }


@dataclass(frozen=True)
class JobRows:
    """One seeded job built the slow, obvious way: the receipts the real paths append, each hashed
    onto the previous one by ``receipt_hash``, and the projection row the reducer folds from them."""

    receipts: list[tuple[Any, ...]]  # RECEIPT_COLUMNS
    hashed: list[str]  # the canonical text each receipt's hash is taken over
    job: dict[str, Any]  # id + projection._columns(fold(receipts))
    delivery: tuple[Any, ...] | None  # DELIVERY_COLUMNS: a finished job's settled dispatch


def job_rows(job_id: str, organization: str, created: datetime, finished: bool) -> JobRows:
    t = moments(created)
    stream = job_stream(job_id)
    steps: list[tuple[str, dict[str, Any], datetime]] = [
        ("job.enqueued", enqueue_body(job_id, organization), t["created"])
    ]
    if finished:
        fence = {"workerId": WORKER, "attempt": 1, "expiresAt": iso(t["expires"])}
        steps += [
            ("job.leased", fence, t["started"]),
            ("job.heartbeat", dict(fence), t["started"]),
            ("job.completed", {"workerId": WORKER, "attempt": 1, "result": {}}, t["started"]),
        ]
    receipts: list[tuple[Any, ...]] = []
    hashed: list[str] = []
    prev: str | None = None
    state = None
    changed_at = created
    for seq, (type_, body, at) in enumerate(steps, start=1):
        at_text = iso(at)
        assert at_text is not None
        digest = receipt_hash(stream, seq, type_, body, at_text, prev)
        over = canonical(
            {"stream": stream, "seq": seq, "type": type_, "body": body, "at": at_text, "prevHash": prev}
        )
        assert hashlib.sha256(over).hexdigest() == digest, "receipt_hash is no longer sha256(canonical)"
        receipts.append((stream, seq, type_, body, at_text, prev, digest))
        hashed.append(over.decode())
        before = state.status if state else None
        state = fold([Receipt(stream=stream, seq=seq, type=type_, body=body, at=at_text)], state)
        assert state is not None
        if state.status != before:
            changed_at = at
        prev = digest
    assert state is not None and prev is not None
    delivery = None
    if finished:
        delivery = (
            *(job_id, "dispatch", "", 0, job_id, driver_task_id(job_id, 0), "settled", "dispatched"),
            *(t["created"], t["deadline"], t["settled"]),
        )
    return JobRows(receipts, hashed, {"id": job_id, **projection._columns(state, prev, changed_at)}, delivery)


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


def render(rows: JobRows) -> tuple[str, str, str]:
    """One job's rows as COPY CSV text: receipts, projection row, delivery record."""
    out = []
    for table in (rows.receipts, [tuple(rows.job.values())], [rows.delivery] if rows.delivery else []):
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        for row in table:
            writer.writerow([_cell(v) for v in row])
        out.append(buf.getvalue())
    return out[0], out[1], out[2]


def _formattable(text_: str, fields: dict[str, str]) -> str:
    out = text_.replace("{", "{{").replace("}", "}}")
    for value, name in fields.items():
        out = out.replace(value, "{" + name + "}")
    return out


class Template:
    """A job kind's rows built once by ``job_rows`` for a prototype job, as format strings: its id,
    organisation, times and hashes become fields. ``fill`` still hashes every receipt of every job
    (SHA-256 over that receipt's canonical text, which holds the previous hash): only the JSON
    encoding, the fold and the CSV quoting are done once. Honest because it is checked: before a
    load against ``job_rows`` for sample jobs (``self_check``), after it by re-folding and
    hash-verifying a sample from the database (``check_sample``)."""

    def __init__(self, finished: bool) -> None:
        self.finished = finished
        proto = job_rows(PROTO_ID, PROTO_ORG, PROTO_AT, finished)
        fields = {PROTO_ID: "j", PROTO_ORG: "o"}
        for name, at in moments(PROTO_AT).items():
            text_ = iso(at)
            assert text_ is not None
            fields[text_] = name
        fields |= {r[6]: f"h{seq}" for seq, r in enumerate(proto.receipts, start=1)}
        self.job_columns = tuple(proto.job)
        self.hashed = [_formattable(h, fields) for h in proto.hashed]
        self.rows = tuple(_formattable(t, fields) for t in render(proto))
        assert self.fill(PROTO_ID, PROTO_ORG, PROTO_AT) == render(proto)

    def fill(self, job_id: str, organization: str, created: datetime) -> tuple[str, str, str]:
        values = {"j": job_id, "o": organization}
        for name, at in moments(created).items():
            values[name] = at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # iso() of a UTC time
        for seq, over in enumerate(self.hashed, start=1):
            values[f"h{seq}"] = hashlib.sha256(over.format_map(values).encode()).hexdigest()
        receipts_, job, delivery = self.rows
        return receipts_.format_map(values), job.format_map(values), delivery.format_map(values)

    def self_check(self, created: list[datetime]) -> None:
        for n, at in enumerate(created):
            job_id, organization = f"seed-{n * 7919 % 10**8:08d}", org(n)
            expected = render(job_rows(job_id, organization, at, self.finished))
            assert self.fill(job_id, organization, at) == expected, (job_id, at)


class Plan:
    """Which seeded job is which: ``kinds[i]`` is 1 for a finished job, 0 for a queued one; job
    ``i`` is ``seed_id(i)``, of ``org(i)``, created at ``start + step * i``."""

    def __init__(self, finished: int, queued: int, rng: random.Random) -> None:
        total = finished + queued
        kinds = bytearray([1]) * finished + bytearray(queued)
        rng.shuffle(kinds)
        self.kinds = bytes(kinds)
        self.end = datetime.now(UTC) - timedelta(hours=1)
        self.start = self.end - SPREAD
        self.step = SPREAD / max(total, 1)
        self.seconds = 0.0  # how long seeding took

    def __len__(self) -> int:
        return len(self.kinds)

    def created(self, i: int) -> datetime:
        return self.start + self.step * i

    def queued_ids(self) -> list[str]:
        return [seed_id(i) for i, kind in enumerate(self.kinds) if not kind]


def chunk_text(plan: Plan, templates: dict[bool, Template], first: int, last: int) -> tuple[str, str, str]:
    """The COPY text of jobs ``first`` .. ``last - 1``: receipts, projection rows, deliveries."""
    receipts_: list[str] = []
    job_rows_: list[str] = []
    deliveries_: list[str] = []
    created = plan.created(first)
    step = plan.step
    for i in range(first, last):
        r, j, d = templates[bool(plan.kinds[i])].fill(f"seed-{i:08d}", f"bench-org-{i % ORGS}", created)
        receipts_.append(r)
        job_rows_.append(j)
        deliveries_.append(d)
        created += step
    return "".join(receipts_), "".join(job_rows_), "".join(deliveries_)


def _produce(out: Any, plan: Plan, templates: dict[bool, Template], chunk: int) -> None:
    """The generator process: chunks of COPY text into ``out``, then ``None`` (or a traceback)."""
    try:
        for first in range(0, len(plan), chunk):
            out.put(chunk_text(plan, templates, first, min(first + chunk, len(plan))))
        out.put(None)
    except BaseException:
        out.put(traceback.format_exc())
        raise


def seed(engine: Engine, finished: int, queued: int, rng: random.Random, *, chunk: int = CHUNK) -> Plan:
    """Bulk-load ``finished`` completed and ``queued`` queued jobs, interleaved over 30 days.

    A separate process renders the rows from the templates checked here (``_produce``) while this
    one COPYs the previous chunk in: one transaction per chunk on each of two connections."""

    plan = Plan(finished, queued, rng)
    templates = {kind: Template(kind) for kind in (True, False)}
    for template in templates.values():
        sample = [plan.created(rng.randrange(len(plan))) for _ in range(SELF_CHECKED)] if len(plan) else []
        template.self_check([plan.start, plan.end, *sample])
    columns = {
        "receipts": RECEIPT_COLUMNS,
        "jobs": templates[True].job_columns,
        "deliveries": DELIVERY_COLUMNS,
    }
    opts = f"WITH (FORMAT csv, NULL '{NULL}')"
    ctx = multiprocessing.get_context("spawn")
    chunks = ctx.Queue(maxsize=2)
    producer = ctx.Process(
        target=_produce, args=(chunks, plan, templates, chunk), name="scale-seed", daemon=True
    )
    started = time.monotonic()
    producer.start()
    # Two connections: the receipts (half the bytes) go in on one, from a thread, while the
    # projection rows and deliveries go in on the other, so two server backends share the work.
    lanes = [("receipts",), ("jobs", "deliveries")]
    conns = [engine.raw_connection() for _ in lanes]
    copied = 0
    waited = 0.0
    done = False

    def copy_lane(n: int, item: tuple[str, str, str]) -> None:
        cur = conns[n].cursor()
        for table in lanes[n]:
            text_ = item[list(columns).index(table)]
            if text_:
                sql = f"COPY {table} ({', '.join(columns[table])}) FROM STDIN {opts}"
                cur.copy_expert(sql, io.StringIO(text_), size=1 << 20)
        conns[n].commit()

    try:
        for raw in conns:
            # Durability of each chunk's commit is not what is measured; the rows are the same.
            raw.cursor().execute("SET synchronous_commit = off")
        with ThreadPoolExecutor(max_workers=1) as pool:
            while True:
                t0 = time.monotonic()
                item = chunks.get(timeout=600)
                waited += time.monotonic() - t0
                if item is None:
                    done = True
                    break
                if isinstance(item, str):
                    raise RuntimeError(f"the seed generator failed:\n{item}")
                receipts_done = pool.submit(copy_lane, 0, item)
                copy_lane(1, item)
                receipts_done.result()
                copied = min(copied + chunk, len(plan))
                if copied % (chunk * 10) == 0:
                    log(f"  seeded {copied}/{len(plan)} jobs ({time.monotonic() - started:.0f} s)")
    finally:
        for raw in conns:
            raw.close()
        producer.join(timeout=30 if done else 0)
        if producer.is_alive():  # this side failed: the generator may be blocked on a full queue
            producer.terminate()
            producer.join()
    loaded = time.monotonic() - started
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        # VACUUM too: autovacuum may be off, and would otherwise work on the tables while timed.
        conn.execute(text("VACUUM (ANALYZE)"))
    plan.seconds = time.monotonic() - started
    log(
        f"  seeded {len(plan)} jobs in {plan.seconds:.0f} s, {len(plan) / plan.seconds:.0f} jobs/s (COPY "
        f"{loaded:.0f} s, of which {waited:.0f} s waiting for the generator; VACUUM (ANALYZE) "
        f"{plan.seconds - loaded:.0f} s)"
    )
    return plan


def check_sample(engine: Engine, rng: random.Random, plan: Plan, n: int = CHECKED) -> None:
    """Re-fold and hash-check a sample of seeded streams from the database: every chain intact,
    and every column of the projection row equal to the reducer's fold (as ``rebuild`` writes it)."""
    finished = sum(plan.kinds)
    with engine.connect() as conn:
        counts = conn.execute(
            text(
                "SELECT (SELECT count(*) FROM receipts), (SELECT count(*) FROM jobs), "
                "(SELECT count(*) FROM deliveries)"
            )
        ).one()
        assert tuple(counts) == (4 * finished + len(plan) - finished, len(plan), finished), counts
        for i in rng.sample(range(len(plan)), min(n, len(plan))):
            job_id = seed_id(i)
            stream = job_stream(job_id)
            checked, broken = store.verify(conn, stream=stream)
            assert checked == (4 if plan.kinds[i] else 1) and broken is None, f"{job_id}: chain {broken}"
            expected = projection.row_of_stream(conn, stream)
            assert expected is not None, job_id
            stored = dict(conn.execute(select(jobs).where(jobs.c.id == job_id)).mappings().one())
            assert stored == expected, (job_id, stored, expected)
    log(f"  checked {min(n, len(plan))} seeded jobs: chains verify, projection rows == fold")


# -- the operations timed ----------------------------------------------------------------------


CLAIM_BATCH = 50


def operations(
    engine: Engine, queue: Queue, total: int, queued: list[str], rng: random.Random
) -> dict[str, Callable[[], Any]]:
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
        # delivery.dispatch.start_driver for one queued job: the job, then in one transaction its
        # delivery bookkeeping (delivery.begin: the lock, the job's delivery records, the insert);
        # rolled back.
        job_id = rng.choice(queued)
        queue.get(job_id)
        with engine.connect() as conn:
            delivery.begin(conn, job_id, job_id, db_now(conn), 120_000, epoch="bench")
            conn.rollback()

    def dispatch_claim() -> None:
        # The scan's batched claim (delivery.dispatch._claim): 50 queued jobs and the clock read in
        # one statement, then delivery.begin_many (one lock statement, one read of their delivery
        # records, one multi-row insert); rolled back.
        ids = rng.sample(queued, min(CLAIM_BATCH, len(queued)))
        with engine.connect() as conn:
            claimed, now = projection.load_jobs_at_clock(conn, ids)
            assert len(claimed) == len(ids)
            requests = [delivery.StartRequest(j.id, j.id, 120_000) for j in claimed]
            delivery.begin_many(conn, requests, now, epoch="bench")
            conn.rollback()

    return {
        "enqueue": enqueue,
        "dispatch scan (start_driver, one job)": dispatch_scan,
        f"dispatch claim, batch of {CLAIM_BATCH}": dispatch_claim,
        "due-retries scan": lambda: queue.due_retries(skip_in_flight=True, epoch="bench"),
        "queued redrive (500 a batch)": lambda: queue.queued_older_than(
            1000, skip_in_flight=True, epoch="bench"
        ),
        "lease expiry scan": lambda: queue.expire_leases(),
        "GET /jobs?status=queued (list query)": lambda: queue.list_jobs(
            organization_id=org(rng.randrange(ORGS)), status="queued"
        ),
        "job read (GET /jobs/<id>)": lambda: queue.get(seed_id(rng.randrange(total))),
    }


_IN_FLIGHT = (
    "NOT EXISTS (SELECT 1 FROM deliveries d WHERE d.job_id = jobs.id AND d.state = 'pending' "
    "AND d.deadline_at > now() AND (d.broker_epoch IS NULL OR d.broker_epoch = 'bench'))"
)
EXPLAINED = {
    "list": "SELECT state, created_at, id FROM jobs WHERE organization_id = 'bench-org-3' AND status = "
    "'queued' ORDER BY created_at DESC, id DESC LIMIT 51",
    "redrive": "SELECT state, status_changed_at FROM jobs WHERE status = 'queued' AND "
    f"coalesce(available_at, status_changed_at) <= now() - interval '1 second' AND {_IN_FLIGHT} "
    "ORDER BY coalesce(available_at, status_changed_at) LIMIT 500",
    "lease expiry": "SELECT id FROM jobs WHERE status IN ('leased', 'running') AND lease_expires_at < now() "
    "ORDER BY lease_expires_at LIMIT 500",
    "due retries": "SELECT state FROM jobs WHERE status = 'queued' AND available_at IS NOT NULL AND "
    f"available_at <= now() AND {_IN_FLIGHT} ORDER BY available_at LIMIT 500",
    "dispatch claim: jobs": "SELECT state FROM jobs WHERE id = ANY(:ids)",
    "dispatch claim: pending deliveries": "SELECT job_id, generation FROM deliveries "
    "WHERE job_id = ANY(:ids) AND state = 'pending'",
    "dispatch claim: last generations": "SELECT job_id, max(generation) FROM deliveries "
    "WHERE job_id = ANY(:ids) AND purpose = 'dispatch' AND observed = '' GROUP BY job_id",
}


def explain(engine: Engine, queued: list[str]) -> None:
    ids = sorted(queued)[:: max(1, len(queued) // CLAIM_BATCH)][:CLAIM_BATCH]
    with engine.connect() as conn:
        for name, sql in EXPLAINED.items():
            plan = conn.execute(text(f"EXPLAIN (ANALYZE, BUFFERS) {sql}"), {"ids": ids}).scalars().all()
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
        plans: dict[str, Plan] = {}
        for name, finished, queued in (
            ("small", 0, args.small_queued),
            ("large", args.finished, args.queued),
        ):
            url = stack.enter_context(fresh_database(f"scale_{name}"))
            engine = make_engine(url)
            stack.callback(engine.dispose)
            upgrade(engine)
            log(f"{name}: seeding {finished} finished + {queued} queued jobs")
            plans[name] = seed(engine, finished, queued, rng)
            check_sample(engine, rng, plans[name])
            engines[name] = engine
            queues[name] = queue_for(engine)
        ops = {
            name: operations(engines[name], queues[name], len(plans[name]), plans[name].queued_ids(), rng)
            for name in engines
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
            f"finished + {args.queued} queued ({sizes[0]} receipts, {sizes[1]} jobs rows, seeded "
            f"in {plans['large'].seconds:.0f} s); {os.cpu_count()} CPUs, load average before the run "
            f"{load[0]:.1f}/{load[1]:.1f}/{load[2]:.1f}, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC"
        )
        per_job = [b / max(sizes[1], 1) for b in disk]
        print(
            f"  on disk per job (tables + indexes): receipts {per_job[0]:.0f} B, jobs {per_job[1]:.0f} B, "
            f"deliveries {per_job[2]:.0f} B; total {sum(disk) / 2**20:.0f} MiB"
        )
        print_table(f"schema at migration {current(engines['large'])} (head)", medians)
        if args.explain:  # before --before-0006 drops indexes: the plans at head
            explain(engines["large"], plans["large"].queued_ids())
        if args.before_0006:
            for engine in engines.values():
                with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                    for index in INDEXES_0006:
                        conn.execute(text(f"DROP INDEX {index}"))
                    conn.execute(text("ANALYZE jobs"))
            log("dropped migration 0006's indexes; timing again")
            before = time_ops(ops, args.reps, time.monotonic() + args.budget_s)
            print_table("the same without migration 0006's two indexes", before)
    return 0


if __name__ == "__main__":
    sys.exit(main())
