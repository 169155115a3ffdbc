"""The floor under the throughput ratios: the least work any design keeping Receipt's contract must do.

``bench/compare.py --systems floor,…`` runs it beside the peers, in the same rounds. It is not
Receipt; it is a generous lower bound on what a Receipt job costs, so that a ratio target can be
checked against what is reachable at all. Per job it does only the parts the contract says may not
change, each in its cheapest form, with nothing of Receipt's code:

* **enqueue** — one autocommitted statement: the projection row, the ``job.enqueued`` receipt
  (hash chained) and the attempt's delivery record (spec step 3: delivery state lives in
  PostgreSQL) in one data-modifying CTE; then the **one Celery message** of the attempt (spec
  step 4; its task id the attempt fence), sent straight from the producer;
* **lease** — one autocommitted statement in the Celery task: the row moved on (guarded by the
  seq it follows) and the ``job.leased`` and ``job.heartbeat`` receipts written if it did;
* **settle** — one more such statement: the row completed, the ``job.completed`` receipt, the
  delivery settled.

Left out, so the floor is *lower* than any real design: the scan pass and the driver stage as a
stage of its own (spec steps 2-4: the wake, the claim and its generation rule; the floor writes
the delivery record with the enqueue and publishes from the producer), every read before a write
(the driver's read and the worker's re-read of spec steps 4 and 5; the worker is handed the seq
and hash it follows), the fold (the projection row is a handful of
columns, not the folded state and its indexes), the heartbeat loop, the handler pool, the ledger,
fetch records and logging. Celery runs with its defaults (early acknowledgement), without
Receipt's late acknowledgement and visibility timeout.

What it keeps exactly: Celery over Redis delivers each attempt; every transition is a receipt on
the real ``receipts`` table (unique ``(stream, seq)``, the append-only triggers), with the chain's
hash computed in Python; ``synchronous_commit`` stays on (the server's default); the times are the
database clock, read the way ``compare.py`` reads Receipt's (``job.enqueued`` → ``job.completed``).

    celery -A bench.floor:app worker --pool threads --concurrency 8 --queues bench-floor

**The batched floor** (``floor-batched``, ``BENCH_FLOOR_BATCHED=1``) lifts exactly the two
constraints issue 25 lifts, and nothing else: a Celery message may carry several attempts, and
several jobs' transitions may share one round trip and one commit. The producer's threads
group-commit their enqueues (a leader writes every enqueue pending when it starts, as one
multi-statement query in one implicit transaction, then sends those attempts as one message);
the worker leases a message's attempts in one such query and settles them in another. Every
receipt is still its own hash-chained row written by its own guarded statement; no reads.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from typing import Any

from celery import Celery

from app.config import switch
from celeryconfig import REDIS_TRANSPORT

TASK = "bench.floor.attempt"
BATCH_TASK = "bench.floor.attempts"
QUEUE = "bench-floor"
TABLE = "floor_jobs"
DELIVERIES = "floor_deliveries"

# The floor's projection: the columns a guarded transition and the recovery scans need, no more.
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {TABLE} (
    id varchar(128) PRIMARY KEY,
    status varchar(16) NOT NULL,
    last_seq integer NOT NULL,
    last_hash varchar(64) NOT NULL,
    lease_expires_at timestamptz
);
CREATE INDEX IF NOT EXISTS ix_{TABLE}_status_lease ON {TABLE} (status, lease_expires_at);
CREATE TABLE IF NOT EXISTS {DELIVERIES} (
    job_id varchar(128) PRIMARY KEY,
    generation integer NOT NULL,
    state varchar(16) NOT NULL
);
"""

_RECEIPTS = "INSERT INTO receipts (stream, seq, type, body, at, prev_hash, hash) "
# With reads (``floor-reads``) every receipt is stamped with the time its read returned, as
# Receipt's are (the time is part of the hash); without, the server stamps it.
_AT = {False: "clock_timestamp()", True: "%(at)s"}


def _enqueue(reads: bool) -> str:
    return (
        f"WITH moved AS (INSERT INTO {TABLE} (id, status, last_seq, last_hash) "
        "VALUES (%(id)s, 'queued', 1, %(h1)s) RETURNING id), "
        f"delivery AS (INSERT INTO {DELIVERIES} (job_id, generation, state) "
        "SELECT id, 1, 'sent' FROM moved) "
        + _RECEIPTS
        + f"SELECT %(stream)s, 1, 'job.enqueued', %(b1)s, {_AT[reads]}, NULL, %(h1)s FROM moved"
    )


def _lease(reads: bool) -> str:
    at = _AT[reads]
    return (
        f"WITH moved AS (UPDATE {TABLE} SET status = 'running', last_seq = 3, last_hash = %(h3)s, "
        f"lease_expires_at = {at}::timestamptz + interval '300 seconds' "
        "WHERE id = %(id)s AND last_seq = 1 RETURNING id) "
        + _RECEIPTS
        + f"SELECT v.* FROM (VALUES (%(stream)s, 2, 'job.leased', %(b2)s::json, {at}::timestamptz, %(h1)s, "
        f"%(h2)s), (%(stream)s, 3, 'job.heartbeat', %(b3)s::json, {at}::timestamptz, %(h2)s, %(h3)s)) "
        "AS v(stream, seq, type, body, at, prev_hash, hash) WHERE EXISTS (SELECT 1 FROM moved)"
    )


def _settle(reads: bool) -> str:
    return (
        f"WITH moved AS (UPDATE {TABLE} SET status = 'completed', last_seq = 4, last_hash = %(h4)s, "
        "lease_expires_at = NULL WHERE id = %(id)s AND last_seq = 3 RETURNING id), "
        f"delivery AS (UPDATE {DELIVERIES} SET state = 'settled' WHERE job_id IN (SELECT id FROM moved)) "
        + _RECEIPTS
        + f"SELECT %(stream)s, 4, 'job.completed', %(b4)s, {_AT[reads]}, %(h3)s, %(h4)s FROM moved"
    )


# The read before each write (``floor-reads``): the database clock and the row the write follows.
READ = (
    "SELECT clock_timestamp(), "
    f"(SELECT row(status, last_seq, last_hash)::text FROM {TABLE} WHERE id = %(id)s)"
)
READS = switch(os.environ.get("BENCH_FLOOR_READS") or "0")
ENQUEUE, LEASE, SETTLE = _enqueue(READS), _lease(READS), _settle(READS)


def link(prev: str | None, kind: str, body: dict[str, Any], at: str = "") -> tuple[str, str]:
    """(the body as JSON, this receipt's hash): the chain, as cheaply as Python does it."""
    text = json.dumps(body, separators=(",", ":"), sort_keys=True)
    return text, hashlib.sha256(f"{prev or ''}|{kind}|{at}|{text}".encode()).hexdigest()


def _read(job_id: str) -> tuple[str, str | None]:
    """(the database clock, the row's ``(status,seq,hash)`` or None): one round trip."""
    with connection().cursor() as cur:
        cur.execute(READ, {"id": job_id})
        now, row = cur.fetchone()
    return now.isoformat(), row


def enqueue_params(job_id: str) -> dict[str, Any]:
    at = ""
    if READS:
        at, row = _read(job_id)
        if row is not None:
            raise RuntimeError(f"{job_id} exists")  # Receipt would return the job; the floor never re-sends
    b1, h1 = link(None, "job.enqueued", {"jobId": job_id, "agentId": "noop", "kind": "factory.run"}, at)
    return {"id": job_id, "stream": f"jobs/{job_id}", "b1": b1, "h1": h1, **({"at": at} if READS else {})}


_local = threading.local()


def connection() -> Any:
    """One autocommitting psycopg2 connection per thread (the worker's pool threads, the producer's)."""
    conn = getattr(_local, "conn", None)
    if conn is None or conn.closed:
        import psycopg2

        dsn = os.environ["BENCH_FLOOR_DSN"]
        conn = _local.conn = psycopg2.connect(dsn)
        conn.autocommit = True
    return conn


def _write(sql: str, params: dict[str, Any]) -> int:
    with connection().cursor() as cur:
        cur.execute(sql, params)
        return int(cur.rowcount)


def attempt(job_id: str, h1: str) -> None:
    """The worker's part of one attempt: lease (two receipts), the no-op handler, settle."""
    fence = f"{job_id}:attempt:1"
    stream = f"jobs/{job_id}"
    extra: dict[str, Any] = {}
    at = ""
    if READS:  # lease only a queued job: decided on the row read, with the clock read beside it
        at, row = _read(job_id)
        if row != f"(queued,1,{h1})":
            return
        extra = {"at": at}
    b2, h2 = link(h1, "job.leased", {"attempt": 1, "fence": fence, "workerId": "floor"}, at)
    b3, h3 = link(h2, "job.heartbeat", {"fence": fence}, at)
    lease = {"id": job_id, "stream": stream, "h1": h1, "b2": b2, "h2": h2, "b3": b3, "h3": h3, **extra}
    if _write(LEASE, lease) != 2:
        return  # the row moved on: nothing was written
    if READS:  # spec step 5: re-read, then settle
        at, row = _read(job_id)
        if row != f"(running,3,{h3})":
            return
        extra = {"at": at}
    b4, h4 = link(h3, "job.completed", {"fence": fence, "result": {}}, at)
    _write(SETTLE, {"id": job_id, "stream": stream, "h3": h3, "b4": b4, "h4": h4, **extra})


def _write_many(sql: str, params: list[dict[str, Any]]) -> None:
    """Every statement in one round trip and, autocommitted as one multi-statement query, one
    implicit transaction: one commit for the lot."""
    from psycopg2.extras import execute_batch

    with connection().cursor() as cur:
        execute_batch(cur, sql, params, page_size=max(1, len(params)))


def attempts(items: list[list[str]]) -> None:
    """The worker's part of a batch of attempts: every lease in one commit, the no-op handlers,
    every settlement in one commit. Each statement stays guarded by the seq it follows."""
    leases, settles = [], []
    for job_id, h1 in items:
        fence, stream = f"{job_id}:attempt:1", f"jobs/{job_id}"
        b2, h2 = link(h1, "job.leased", {"attempt": 1, "fence": fence, "workerId": "floor"})
        b3, h3 = link(h2, "job.heartbeat", {"fence": fence})
        b4, h4 = link(h3, "job.completed", {"fence": fence, "result": {}})
        leases.append({"id": job_id, "stream": stream, "h1": h1, "b2": b2, "h2": h2, "b3": b3, "h3": h3})
        settles.append({"id": job_id, "stream": stream, "h3": h3, "b4": b4, "h4": h4})
    _write_many(LEASE, leases)
    _write_many(SETTLE, settles)


class GroupSender:
    """The producer's enqueue with group commit: a thread that finds no write in progress writes
    every enqueue pending (its own and those that arrived meanwhile) in one commit and sends their
    attempts as one message; the others wait for that commit."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._pending: list[dict[str, Any]] = []
        self._done: set[str] = set()
        self._failed: dict[str, BaseException] = {}
        self._writing = False

    def __call__(self, job_id: str) -> str:
        params = enqueue_params(job_id)
        with self._cond:
            self._pending.append(params)
            while self._writing and job_id not in self._done and job_id not in self._failed:
                self._cond.wait()
            if job_id in self._done or job_id in self._failed:
                return self._outcome(job_id)
            self._writing = True
            batch, self._pending = self._pending, []
        error: BaseException | None = None
        try:
            _write_many(ENQUEUE, batch)
            items = [[b["id"], b["h1"]] for b in batch]
            app.send_task(BATCH_TASK, args=[items], queue=QUEUE, task_id=f"{items[0][0]}:batch:{len(items)}")
        except BaseException as exc:  # every waiter of this batch is told
            error = exc
        with self._cond:
            self._writing = False
            for b in batch:
                if error is None:
                    self._done.add(b["id"])
                else:
                    self._failed[b["id"]] = error
            self._cond.notify_all()
            return self._outcome(job_id)

    def _outcome(self, job_id: str) -> str:
        """Called holding the lock: the job's batch is written (its id) or failed (raised)."""
        self._done.discard(job_id)
        error = self._failed.pop(job_id, None)
        if error is not None:
            raise error
        return job_id


def make_app(broker: str) -> Celery:
    floor = Celery("bench_floor_receipts", broker=broker, set_as_current=False)
    floor.conf.update(
        task_default_queue=QUEUE,
        task_ignore_result=True,
        task_serializer="json",
        accept_content=["json"],
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
    )
    # Receipt's kombu transport: one redis client per pool instead of one per publish and ack.
    floor.conf.broker_transport = REDIS_TRANSPORT
    floor.task(name=TASK, shared=False)(attempt)
    floor.task(name=BATCH_TASK, shared=False)(attempts)
    return floor


app = make_app(os.environ.get("BENCH_FLOOR_BROKER", "redis://127.0.0.1:6379/0"))


def sender(batched: bool = False) -> Any:
    """The producer's send: the enqueue statement, then the attempt's one Celery message; batched,
    the group-committed enqueue and one message per commit (``GroupSender``)."""
    if batched:
        return GroupSender()

    def send(job_id: str) -> str:
        params = enqueue_params(job_id)
        _write(ENQUEUE, params)
        app.send_task(TASK, args=[job_id, params["h1"]], queue=QUEUE, task_id=f"{job_id}:attempt:1")
        return job_id

    return send
