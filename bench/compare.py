"""Receipt against Procrastinate and Celery, no-op jobs end to end, in one run.

    .venv/bin/python -m bench.compare [--jobs 1000] [--rounds 3] [--idle 50] [--count-jobs 200]
                                      [--bulk [N]] [--bulk-size 500]
    .venv/bin/python -m bench.compare --quick        # small counts: proves it runs (~5 min)
    .venv/bin/python -m bench.compare --bulk         # also the bulk phase: 10 000 jobs, batches of 500

Needs the ``bench`` extra (``pip install -e '.[bench]'``; ``make bench`` does it), PostgreSQL on
127.0.0.1:5432 (``BENCH_PG_ADMIN_URL``) and ``redis-server`` on PATH. Four systems; in every round
each is deployed afresh — a new database (created and dropped here) and, where it needs a broker,
its own private redis-server on a free port — and only one system runs at a time:

* **Receipt, Python enqueue** — the real processes (gunicorn, a ``driver``, a ``worker-chat`` with
  the ``noop`` agent of ``devharness.handlers``, execute concurrency 8); the producer calls
  ``Queue.enqueue`` in-process with the API's own wake-up publisher (``api.wake.default_waker``).
* **Receipt, HTTP enqueue** — the same deployment (started again); the producer posts ``/agents/noop/jobs`` to
  gunicorn (its default two gevent workers) over keep-alive connections.
* **Procrastinate** — ``procrastinate worker --concurrency 8`` (``bench.peers``: the default
  ``PsycopgConnector``, LISTEN/NOTIFY on); the producer calls ``noop.defer()`` from Python.
* **Celery** — ``bench.runtime_bench:baseline_app`` (a no-op task), ``--pool prefork
  --concurrency 2``, Redis broker, Postgres result backend through psycopg2.
* On request (``--systems``), **the floors** of ``bench/floor.py`` (``floor``, ``floor-reads``,
  ``floor-batched``): not Receipt, the least work any design keeping Receipt's contract does per
  job (``floor-batched``: with several attempts a message and shared commits, as issue 25 allows),
  to show which ratio targets are reachable at all on this machine.

Receipt runs with its production timings and with prepared statements on
(``RECEIPT_DB_PREPARED_STATEMENTS=enabled``, as a deployment connecting to PostgreSQL directly
would run; ``--unprepared`` measures the default, off).

Every producer runs in its own process with ``--clients`` threads. Per round and system: a burst
of ``--jobs`` jobs (throughput), then ``--idle`` jobs one at a time (idle latency), then jobs sent
at a steady 50 % of that round's measured rate for ``--loaded-s`` seconds (loaded latency). The
systems take turns within a round, in a rotated order each round; the table shows the medians
over the rounds.

With ``--bulk [N]`` (``N`` 10 000 when not given; ``--quick``: 1 000), each round also has a bulk
phase: every system with a bulk path of its own sends ``N`` jobs in calls of ``--bulk-size`` jobs
(500; ``--quick``: 100), its ``--clients`` producer threads each sending whole batches flat out,
and the round waits until all are done. The rows: Receipt's ``Queue.enqueue_many`` in-process
(the same queue and wake-up publisher as its Python enqueue: the queue's after-commit hook wakes
delivery once per batch, as the API's batch route does), Receipt's ``POST /jobs:batch`` over
keep-alive connections (``--bulk-size`` at most ``RECEIPT_BATCH_MAX``, 1 000), Procrastinate's
``batch_defer`` and — the same ``N`` jobs — its ``defer`` one at a time, and Celery's ``group`` of
signatures (``apply_async``: one message per task, its normal bulk path). The floors have no bulk
path and are left out. Each row runs on a fresh deployment of its own, the rows in a rotated order
each round; the bulk table shows each row's median jobs/s (first enqueue → last completion, as
below), its CPU ms per job by process, and the ratio of Receipt's HTTP bulk row to the faster of
Procrastinate's two rows (the target: at least 1.5).

Definitions (the same for everyone as far as each system records it):

* jobs/s = jobs / (first enqueue → last completion), both from what the system stores: Receipt's
  ``job.enqueued`` / ``job.completed`` receipt times (database clock); Procrastinate's
  ``deferred`` / ``succeeded`` events (database ``now()``); for Celery, which stores no enqueue
  time, the producer's clock before the first send → the latest ``date_done`` (in the bulk phase,
  before the first batch's send: a batch's tasks all carry its send time).
* latency = the same two times per job.
* CPU ms per job = CPU time (``/proc``) of each process over the burst phase (the bulk phase's
  own, for the bulk table) ÷ jobs. Process trees count (gunicorn's workers, Celery's prefork
  children); the producer reports its own CPU over its send loop; Postgres = the backends
  connected to that system's database (including the producer's and this script's polling, both
  small; the bulk phase polls every 0.25 s).
* Statements, round trips and commits per job: ``pg_stat_statements`` is not loaded on the shared
  server (and ``shared_preload_libraries`` cannot change without a restart), so each system gets
  one more short deployment on a database with ``log_statement = 'all'`` (set on that database
  only) and the statements the server logged for that database name (``%u@%d`` in
  ``log_line_prefix``) are counted, together with the ``xact_commit`` / ``xact_rollback`` deltas
  of ``pg_stat_database`` (read after the backends went idle long enough to flush them, ~11 s).
  Every logged statement is one client→server round trip (BEGIN, COMMIT and pool pre-pings
  included); the count includes what the processes do while idle during that window.

Each system is one ``System`` class of ``bench/systems.py``: how it is started on its fresh database,
how a producer sends it one job and sees it done, and how its own records say how many jobs finished
and when. The run loop, the statement count and the report here iterate over those instances.

Every wait is bounded; ``--budget-s`` stops starting new rounds. Processes are stopped by PID
(``tests.support.processes.Harness``), databases dropped, redis-servers stopped.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import text
from sqlalchemy.engine import Engine

from bench.runtime_bench import CpuMeter, backend_pids, child_env, fresh_database, log, percentile
from bench.systems import BY_NAME, DEFAULT_SYSTEMS, RECEIPT_SETTINGS, SYSTEMS, Database, Deployment, System
from devharness.processes import PYTHON, Harness
from devharness.waiting import wait_for

POLL_S = 0.05
IDLE_POLL_S = 0.002
# A bulk batch's done count reads thousands of rows (Celery's: every task id it was sent): polled
# less often, its own cost on the database stays small beside the system's.
BULK_POLL_S = 0.25
BULK_JOBS, BULK_SIZE = 10_000, 500
QUICK_BULK_JOBS, QUICK_BULK_SIZE = 1000, 100
# Receipt's HTTP bulk row at least this many times the faster of Procrastinate's two bulk rows.
BULK_TARGET = 1.5
DONE_TIMEOUT_S = 300.0
STATS_FLUSH_S = 11.0  # PostgreSQL 15 flushes an idle backend's pending counters within 10 s

T = TypeVar("T")


# -- deployments ------------------------------------------------------------------------------------


@contextmanager
def deploy(
    system: System, harness: Harness, home: Path, *, log_all: bool = False, prepared: bool = True
) -> Iterator[Deployment]:
    """A fresh database and the system's processes, warmed up; everything stopped/dropped on exit.
    ``prepared``: Receipt with ``RECEIPT_DB_PREPARED_STATEMENTS=enabled`` (``--unprepared``: off)."""
    from app.storage.db import make_engine

    with ExitStack() as stack:
        url = stack.enter_context(fresh_database(f"cmp_{system.kind.replace('-', '_')}"))
        database = url.rsplit("/", 1)[1]
        if log_all:
            setup = make_engine(url)
            with setup.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text(f"ALTER DATABASE {database} SET log_statement = 'all'"))
            setup.dispose()
        # This script's own connections (polling, CPU sampling) never log their statements.
        engine = make_engine(url, connect_args={"options": "-c log_statement=none"})
        stack.callback(engine.dispose)
        db = Database(url, database, engine, lambda: backend_pids(engine))
        dep = system.start(stack, harness, home, db, prepared=prepared)
        warm(dep, system.warmed_by(), "warm-", harness)
        yield dep


def warm(dep: Deployment, system: System, prefix: str, harness: Harness, n: int = 20) -> None:
    """Send ``n`` jobs and wait for them: proves the consumers run and fills every pool."""
    result = produce(dep, system, "burst", prefix, n, clients=2)
    wait_done(dep, prefix, n, result, harness)
    log(f"{system.name}: up, {n} warm-up jobs done")


# -- counting what is done ----------------------------------------------------------------------------


POLLS = [0]  # transactions this script ran on the systems' databases (subtracted from the counts)


def done_count(dep: Deployment, prefix: str, result: dict[str, Any]) -> int:
    """Jobs of this batch completed so far; one transaction (a rollback) per call."""
    POLLS[0] += 1
    with dep.engine.connect() as conn:
        return dep.system.done_count(conn, prefix, result)


def wait_done(
    dep: Deployment,
    prefix: str,
    n: int,
    result: dict[str, Any],
    harness: Harness | None,
    interval: float = POLL_S,
) -> None:
    wait_for(
        lambda: done_count(dep, prefix, result) >= n,
        DONE_TIMEOUT_S,
        interval=interval,
        what=f"{n} {dep.system.kind} jobs ({prefix}) to complete",
        check=harness.check_alive if harness else None,
    )


def timings(dep: Deployment, prefix: str, result: dict[str, Any]) -> tuple[list[float], float]:
    """(latencies in ms, span in s from the first enqueue to the last completion)."""
    with dep.engine.connect() as conn:
        return dep.system.timings(dep, conn, prefix, result)


# -- the producer (a separate process) -----------------------------------------------------------------


def produce(
    dep: Deployment,
    system: System,
    mode: str,
    prefix: str,
    n: int,
    *,
    clients: int = 1,
    rate: float = 0.0,
    batch: int = 0,
    on_result: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Run the producer process; ``on_result`` runs while it is still alive (its backends too)."""
    argv = [
        PYTHON,
        "-m",
        "bench.compare",
        "produce",
        system.name,
        mode,
        prefix,
        str(n),
        str(clients),
        str(rate),
        str(batch),
    ]
    proc = subprocess.Popen(
        argv,
        env=child_env(**dep.producer_env),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line:
            proc.wait(timeout=30)
            raise RuntimeError(f"producer failed: {proc.stderr.read() if proc.stderr else ''}")
        result: dict[str, Any] = json.loads(line)
        if result.get("errors"):
            raise RuntimeError(f"producer errors: {result['errors']}")
        if result.get("retried"):
            retried = result["retried"]
            log(f"  {system.name}: {retried} sends retried: the server's connection limit was reached")
        if on_result is not None:
            on_result(result)
        return result
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def producer_main(
    system: System, mode: str, prefix: str, n: int, clients: int, rate: float, batch: int
) -> None:
    """Send ``n`` jobs: ``burst`` (``clients`` threads, flat out), ``bulk`` (``clients`` threads,
    flat out, each sending whole batches of ``batch`` jobs through the system's bulk path), ``rate``
    (one thread, ``rate``/s), ``idle`` (one at a time, each after the previous completed). Prints
    one JSON line, then waits for stdin to close so the caller can sample its database backends."""
    from app.storage.db import make_engine

    engine = make_engine(os.environ["BENCH_DB"], pool_size=16, prepared_statements=system.producer_prepared())
    if mode == "bulk":
        send_many = system.bulk_sender(engine, prefix)
    else:
        send, is_done = system.sender(engine, prefix)
    ids = [f"{prefix}{i:06d}" for i in range(n)]
    sent: dict[str, float] = {}
    errors: list[str] = []
    lock = threading.Lock()

    retried = [0]

    def retrying(call: Callable[[], T]) -> T:
        for _ in range(4):
            try:
                return call()
            except Exception as exc:
                # The shared server's connection limit, reached by other work on the machine: a
                # retry, counted and reported. Anything else fails the run.
                if "too many clients" not in str(exc):
                    raise
                retried[0] += 1
                time.sleep(0.5)
        return call()

    def one(job_id: str) -> str:
        at = time.time()
        key = retrying(lambda: send(job_id))
        with lock:
            sent[key] = at
        return key

    def many(job_ids: list[str]) -> None:
        at = time.time()
        keys = retrying(lambda: send_many(job_ids))
        with lock:
            sent.update(dict.fromkeys(keys, at))

    def single(job_ids: list[str]) -> None:
        one(job_ids[0])

    cpu0 = time.process_time()
    start = time.time()
    if mode in ("burst", "bulk"):
        if mode == "bulk":
            units, send_unit = [ids[i : i + batch] for i in range(0, n, batch)], many
        else:
            units, send_unit = [[job_id] for job_id in ids], single

        def client(share: list[list[str]]) -> None:
            for unit in share:
                try:
                    send_unit(unit)
                except Exception as exc:  # reported, and the run fails
                    errors.append(f"{unit[0]}: {exc!r}"[:300])

        threads = [threading.Thread(target=client, args=(units[i::clients],)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    elif mode == "rate":
        for i, job_id in enumerate(ids):
            delay = start + i / rate - time.time()
            if delay > 0:
                time.sleep(delay)
            one(job_id)
    else:
        for job_id in ids:
            key = one(job_id)
            wait_for(functools.partial(is_done, key), 60, interval=IDLE_POLL_S, what=f"idle job {key}")
    end = time.time()
    cpu = time.process_time() - cpu0
    print(
        json.dumps(
            {
                "start": start,
                "end": end,
                "cpu_s": cpu,
                "sent": sent,
                "errors": errors[:5],
                "retried": retried[0],
            }
        ),
        flush=True,
    )
    sys.stdin.read()


# -- one round of one system ----------------------------------------------------------------------------


@dataclass
class RoundFigures:
    throughput: float
    idle: list[float]
    loaded: list[float]
    loaded_rate: float
    cpu_ms: dict[str, float]


def measure_burst(
    dep: Deployment,
    system: System,
    prefix: str,
    n: int,
    args: argparse.Namespace,
    harness: Harness,
    *,
    batch: int = 0,
    interval: float = POLL_S,
) -> tuple[float, dict[str, float]]:
    """Send ``n`` jobs flat out from ``--clients`` threads (in batches of ``batch`` through the
    system's bulk path, when given) and wait for them: (jobs/s, CPU ms per job by process)."""
    meter = CpuMeter(dep.cpu_groups)
    producer_cpu: dict[str, float] = {}

    def finish(result: dict[str, Any]) -> None:
        wait_done(dep, prefix, n, result, harness, interval=interval)
        producer_cpu["producer"] = result["cpu_s"]
        meter.stop()

    mode = "bulk" if batch else "burst"
    meter.start()
    burst = produce(dep, system, mode, prefix, n, clients=args.clients, batch=batch, on_result=finish)
    _, span = timings(dep, prefix, burst)
    cpu = {k: v * 1000 / n for k, v in {**producer_cpu, **meter.used}.items()}
    for idle_group in system.idle_groups:
        cpu.pop(idle_group, None)
    return n / span, cpu


def run_round(
    dep: Deployment, system: System, tag: str, args: argparse.Namespace, harness: Harness
) -> RoundFigures:
    throughput, cpu = measure_burst(dep, system, f"{tag}-b-", args.jobs, args, harness)

    idle_prefix = f"{tag}-i-"
    idle = produce(dep, system, "idle", idle_prefix, args.idle)
    idle_lat, _ = timings(dep, idle_prefix, idle)

    rate = throughput / 2
    n_loaded = max(20, min(args.jobs, int(rate * args.loaded_s)))
    loaded_prefix = f"{tag}-l-"
    loaded = produce(dep, system, "rate", loaded_prefix, n_loaded, rate=rate)
    wait_done(dep, loaded_prefix, n_loaded, loaded, harness)
    loaded_lat, _ = timings(dep, loaded_prefix, loaded)
    achieved = n_loaded / max(loaded["end"] - loaded["start"], 1e-9)
    log(
        f"  {system.name}: {throughput:.1f} jobs/s; idle p50 {statistics.median(idle_lat):.1f} ms; "
        f"loaded p99 {percentile(loaded_lat, 99):.1f} ms at {achieved:.1f}/s"
    )
    return RoundFigures(throughput, idle_lat, loaded_lat, achieved, cpu)


# -- the bulk phase: many jobs per call --------------------------------------------------------------------


@dataclass(frozen=True)
class BulkRow:
    """One row of the bulk table: a system's own bulk path, or (``batched`` false) the same jobs
    sent one at a time."""

    system: System
    batched: bool

    @property
    def name(self) -> str:
        return self.system.name if self.batched else f"{self.system.name}-single"

    @property
    def label(self) -> str:
        if self.batched and self.system.bulk_label is not None:
            return self.system.bulk_label
        return f"{self.system.label}, one at a time"


def bulk_rows(systems: list[System]) -> list[BulkRow]:
    """The bulk table's rows of these systems; one without a bulk path (the floors) has none."""
    rows: list[BulkRow] = []
    for system in systems:
        if system.bulk_label is not None:
            rows.append(BulkRow(system, batched=True))
        if system.bulk_singles:
            rows.append(BulkRow(system, batched=False))
    return rows


@dataclass
class BulkFigures:
    throughput: float
    cpu_ms: dict[str, float]


def run_bulk_round(
    dep: Deployment, row: BulkRow, tag: str, args: argparse.Namespace, harness: Harness
) -> BulkFigures:
    throughput, cpu = measure_burst(
        dep,
        row.system,
        f"{tag}-k-",
        args.bulk,
        args,
        harness,
        batch=args.bulk_size if row.batched else 0,
        interval=BULK_POLL_S,
    )
    log(f"  {row.label}: {throughput:.1f} jobs/s")
    return BulkFigures(throughput, cpu)


# -- statements, round trips and commits per job ---------------------------------------------------------


def server_log_path(engine: Engine) -> Path | None:
    """The server's stderr log (the machine's Postgres logs to a file; no logging collector)."""
    configured = os.environ.get("BENCH_PG_LOG")
    if configured:
        return Path(configured)
    with engine.connect() as conn:
        pid = int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())
        try:
            return Path(os.readlink(f"/proc/{pid}/fd/2"))
        except OSError:
            return None


STATEMENT = re.compile(r"@(\S+) LOG:  (?:statement|execute [^:]*): (.*)")


def count_statements(
    args: argparse.Namespace, home: Path, wanted: list[System]
) -> dict[System, dict[str, float]]:
    """Per system: statements logged per job, of which transaction control, and commits per job.
    Systems of one kind share one deployment."""
    out: dict[System, dict[str, float]] = {}
    for kind in dict.fromkeys(system.kind for system in SYSTEMS):
        systems = [s for s in SYSTEMS if s.kind == kind and s in wanted]
        if not systems:
            continue
        harness = Harness(home / f"count-{kind}-logs")
        try:
            with deploy(systems[0], harness, home, log_all=True, prepared=not args.unprepared) as dep:
                path = server_log_path(dep.engine)
                if path is None or not path.exists():
                    log("the server log is not readable here: statements not counted")
                    return out
                for system in systems:
                    prefix = f"count-{system.name}-"
                    offset = path.stat().st_size
                    before = xacts(dep.engine)
                    polls = POLLS[0]
                    result = produce(dep, system, "burst", prefix, args.count_jobs, clients=args.clients)
                    wait_done(dep, prefix, args.count_jobs, result, harness, interval=0.5)
                    time.sleep(STATS_FLUSH_S)
                    after = xacts(dep.engine)
                    # Each poll above, and the first xacts() read, ended in a rollback of ours.
                    ours = POLLS[0] - polls + 1
                    with path.open("rb") as f:
                        f.seek(offset)
                        lines = f.read().decode("utf-8", "replace").splitlines()
                    stmts = [
                        m.group(2) for m in map(STATEMENT.search, lines) if m and m.group(1) == dep.database
                    ]
                    control = sum(
                        1 for s in stmts if s.strip().upper().split(" ")[0] in ("BEGIN", "COMMIT", "ROLLBACK")
                    )
                    n = args.count_jobs
                    out[system] = {
                        "statements": len(stmts) / n,
                        "transaction control": control / n,
                        "commits": (after[0] - before[0]) / n,
                        "rollbacks": (after[1] - before[1] - ours) / n,
                    }
                    log(f"  {system.name}: {out[system]}")
        finally:
            harness.stop_all()
    return out


def xacts(engine: Engine) -> tuple[int, int]:
    with engine.connect() as conn:
        conn.execute(text("SELECT pg_stat_clear_snapshot()"))
        row = conn.execute(
            text("SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = current_database()")
        ).one()
    return int(row[0]), int(row[1])


# -- main --------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["produce"]:
        name, mode, prefix, n, clients, rate, batch = argv[1:8]
        producer_main(BY_NAME[name], mode, prefix, int(n), int(clients), float(rate), int(batch))
        return 0
    args = parse_args(argv)
    try:
        import procrastinate  # noqa: F401
    except ImportError:
        print("bench/compare.py needs the bench extra: .venv/bin/pip install -e '.[bench]'", file=sys.stderr)
        return 2
    systems = [BY_NAME[s] for s in args.systems.split(",") if s]
    run(args, systems)
    return 0


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.compare")
    parser.add_argument("--jobs", type=int, default=1000, help="jobs in each throughput burst")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--idle", type=int, default=50, help="jobs sent one at a time (idle latency)")
    parser.add_argument("--loaded-s", type=float, default=10.0, help="seconds at 50 %% of the max rate")
    parser.add_argument("--clients", type=int, default=4, help="producer threads in a burst")
    parser.add_argument("--count-jobs", type=int, default=200, help="jobs in the statement count (0: skip)")
    parser.add_argument("--budget-s", type=float, default=1800, help="start no round after this")
    parser.add_argument(
        "--systems", default=",".join(DEFAULT_SYSTEMS), help=f"comma-separated, of: {', '.join(BY_NAME)}"
    )
    parser.add_argument(
        "--unprepared",
        action="store_true",
        help="run Receipt without prepared statements (RECEIPT_DB_PREPARED_STATEMENTS's default)",
    )
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="ENV=VALUE",
        help="a setting for Receipt's processes (repeatable), e.g. RECEIPT_DELIVERY_LOCAL=disabled",
    )
    parser.add_argument(
        "--bulk",
        type=int,
        nargs="?",
        const=None,
        default=0,
        metavar="N",
        help=f"also a bulk phase of N jobs per row ({BULK_JOBS} when N is not given; 0: none)",
    )
    parser.add_argument(
        "--bulk-size",
        type=int,
        default=BULK_SIZE,
        help="jobs per call in the bulk phase (Receipt's HTTP row: at most RECEIPT_BATCH_MAX, 1000)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"--jobs 200 --idle 10 --loaded-s 3 --count-jobs 50; --bulk: {QUICK_BULK_JOBS} jobs "
        f"in batches of {QUICK_BULK_SIZE}",
    )
    if "--quick" in argv:  # smaller defaults; flags given explicitly still win
        parser.set_defaults(jobs=200, idle=10, loaded_s=3.0, count_jobs=50, bulk_size=QUICK_BULK_SIZE)
    args = parser.parse_args(argv)
    if args.bulk is None:  # --bulk without N
        args.bulk = QUICK_BULK_JOBS if args.quick else BULK_JOBS
    if args.bulk < 0 or args.bulk_size < 1:
        parser.error("--bulk must be at least 0 and --bulk-size at least 1")
    unknown = [s for s in args.systems.split(",") if s and s not in BY_NAME]
    if unknown:
        parser.error(f"--systems: unknown {', '.join(unknown)}; choose from {', '.join(BY_NAME)}")
    malformed = [s for s in args.setting if "=" not in s or not s.startswith("RECEIPT_")]
    if malformed:
        parser.error(f"--setting: {', '.join(malformed)}: give RECEIPT_<NAME>=<value>")
    RECEIPT_SETTINGS.update(dict(s.split("=", 1) for s in args.setting))
    return args


def run(args: argparse.Namespace, systems: list[System]) -> None:
    """Every round of every system (and bulk row), then the report."""
    rows = bulk_rows(systems) if args.bulk else []
    load_start = os.getloadavg()
    deadline = time.monotonic() + args.budget_s
    figures: dict[System, list[RoundFigures]] = {s: [] for s in systems}
    bulk: dict[BulkRow, list[BulkFigures]] = {row: [] for row in rows}
    with tempfile.TemporaryDirectory(prefix="receipt-compare-") as tmp:
        home = Path(tmp)
        for r in range(args.rounds):
            if time.monotonic() > deadline:
                log(f"budget reached: {r} rounds done")
                break
            order = systems[r % len(systems) :] + systems[: r % len(systems)]
            log(f"round {r + 1}/{args.rounds}: {', '.join(s.name for s in order)}")
            for system in order:
                # One system's processes at a time, each on a fresh database: the machine's
                # PostgreSQL has a connection limit shared with everything else running on it.
                harness = Harness(home / f"logs-{r}-{system.name}")
                try:
                    with deploy(system, harness, home, prepared=not args.unprepared) as dep:
                        figures[system].append(run_round(dep, system, f"r{r}-{system.name}", args, harness))
                finally:
                    harness.stop_all()
            bulk_order = rows[r % len(rows) :] + rows[: r % len(rows)] if rows else []
            if bulk_order:
                log(f"round {r + 1}/{args.rounds}, bulk: {', '.join(row.name for row in bulk_order)}")
            for row in bulk_order:
                # Each row on a fresh deployment too: a row never runs on what an earlier one left.
                harness = Harness(home / f"logs-{r}-bulk-{row.name}")
                try:
                    with deploy(row.system, harness, home, prepared=not args.unprepared) as dep:
                        bulk[row].append(run_bulk_round(dep, row, f"r{r}-{row.name}", args, harness))
                finally:
                    harness.stop_all()
        counted = count_statements(args, home, systems) if args.count_jobs else {}
    load_end = os.getloadavg()
    report(args, figures, counted, load_start, load_end)
    if rows:
        report_bulk(args, bulk)


def report(
    args: argparse.Namespace,
    figures: dict[System, list[RoundFigures]],
    counted: dict[System, dict[str, float]],
    load_start: tuple[float, float, float],
    load_end: tuple[float, float, float],
) -> None:
    rounds = min(len(v) for v in figures.values())
    med = {s.name: statistics.median(f.throughput for f in v) for s, v in figures.items() if v}
    print()
    print(
        f"Comparison, no-op jobs: {args.jobs} per burst, {rounds} rounds alternated (medians), "
        f"{args.clients} producer threads, {os.cpu_count()} CPUs, "
        f"load average {load_start[0]:.1f} at start, {load_end[0]:.1f} at end "
        f"({datetime.now(UTC):%Y-%m-%d %H:%M} UTC); Receipt's prepared statements "
        f"{'off' if args.unprepared else 'on'}" + (f"; {', '.join(args.setting)}" if args.setting else "")
    )
    head = f"  {'system':<32} {'jobs/s':>8} {'/Procr.':>8} {'/Celery':>8} {'idle p50':>9} {'idle p99':>9}"
    print(head + f" {'loaded p50':>11} {'loaded p99':>11} {'at jobs/s':>10}")
    for s, v in figures.items():
        if not v:
            continue
        idle = [x for f in v for x in f.idle]
        loaded = [x for f in v for x in f.loaded]
        vs_p = f"{med[s.name] / med['procrastinate']:8.2f}" if "procrastinate" in med else f"{'-':>8}"
        vs_c = f"{med[s.name] / med['celery']:8.2f}" if "celery" in med else f"{'-':>8}"
        print(
            f"  {s.label:<32} {med[s.name]:8.1f} {vs_p} {vs_c} {statistics.median(idle):9.1f} "
            f"{percentile(idle, 99):9.1f} {statistics.median(loaded):11.1f} {percentile(loaded, 99):11.1f} "
            f"{statistics.median(f.loaded_rate for f in v):10.1f}"
        )
    print("  (latencies in ms over every round's jobs; jobs/s per round:", end="")
    print(
        "; ".join(f" {s.name} " + "/".join(f"{f.throughput:.0f}" for f in v) for s, v in figures.items())
        + ")"
    )
    if "procrastinate" in med and "celery" in med:
        print("  targets (issue 25; measured here, on this machine's load):")
        for s in SYSTEMS:
            for target in s.targets if s.name in med else ():
                value = med[s.name] / med[target.peer]
                print(f"    {target.claim:<40} {value:6.2f}  {'met' if value >= target.least else 'NOT met'}")
    for s in SYSTEMS:
        if s.latency_targets and figures.get(s):
            idle = [x for f in figures[s] for x in f.idle]
            loaded = [x for f in figures[s] for x in f.loaded]
            p50, p99 = statistics.median(idle), percentile(loaded, 99)
            print(
                f"    {s.name}: idle p50 {p50:.1f} ms (<= 8: {'met' if p50 <= 8 else 'NOT met'}); "
                f"loaded p99 {p99:.1f} ms (<= 100: {'met' if p99 <= 100 else 'NOT met'})"
            )
    print("  CPU ms per job during the burst (median over rounds; 'postgres' = that database's backends):")
    for s, v in figures.items():
        if not v:
            continue
        keys = list(v[0].cpu_ms)
        parts = {k: statistics.median(f.cpu_ms.get(k, 0.0) for f in v) for k in keys}
        print(
            f"    {s.label:<32} "
            + ", ".join(f"{k} {x:.2f}" for k, x in parts.items())
            + f"; total {sum(parts.values()):.2f}"
        )
    if counted:
        print(
            f"  per job, from a separate deployment per system with log_statement='all' on its database "
            f"({args.count_jobs} jobs; every logged statement is one round trip):"
        )
        print(
            f"    {'system':<32} {'statements':>11} {'of which BEGIN/COMMIT/ROLLBACK':>31}"
            f" {'commits':>8} {'rollbacks':>10}"
        )
        for s, c in counted.items():
            print(
                f"    {s.label:<32} {c['statements']:11.1f} {c['transaction control']:31.1f} "
                f"{c['commits']:8.1f} {c['rollbacks']:10.1f}"
            )


def report_bulk(args: argparse.Namespace, bulk: dict[BulkRow, list[BulkFigures]]) -> None:
    rounds = min(len(v) for v in bulk.values())
    med = {row.name: statistics.median(f.throughput for f in v) for row, v in bulk.items() if v}
    # The peer a bulk target is held against: the faster of its two ways of sending many jobs.
    peer = max((med[n] for n in ("procrastinate", "procrastinate-single") if n in med), default=None)
    width = max(len(row.label) for row in bulk)
    print()
    print(
        f"Bulk, no-op jobs: {args.bulk} per row in batches of {args.bulk_size}, each of the "
        f"{args.clients} producer threads sending whole batches (rows sending one job at a time: "
        f"{args.clients} threads too), each row on a fresh deployment, {rounds} rounds alternated (medians)"
    )
    print(f"  {'system':<{width}} {'jobs/s':>8} {'/Procr. best':>13}")
    for row, v in bulk.items():
        if not v:
            continue
        vs_p = f"{med[row.name] / peer:13.2f}" if peer else f"{'-':>13}"
        print(f"  {row.label:<{width}} {med[row.name]:8.1f} {vs_p}")
    print("  (/Procr. best: against the faster of Procrastinate's two rows; jobs/s per round:", end="")
    print(
        "; ".join(f" {row.name} " + "/".join(f"{f.throughput:.0f}" for f in v) for row, v in bulk.items())
        + ")"
    )
    if peer and "receipt-http" in med:
        value = med["receipt-http"] / peer
        print(
            f"  target: Receipt HTTP bulk >= {BULK_TARGET}x the faster Procrastinate mode: "
            f"{value:.2f}  {'met' if value >= BULK_TARGET else 'NOT met'}"
        )
    print("  CPU ms per job (median over rounds; 'postgres' = that database's backends):")
    for row, v in bulk.items():
        if not v:
            continue
        parts = {k: statistics.median(f.cpu_ms.get(k, 0.0) for f in v) for k in v[0].cpu_ms}
        print(
            f"    {row.label:<{width}} "
            + ", ".join(f"{k} {x:.2f}" for k, x in parts.items())
            + f"; total {sum(parts.values()):.2f}"
        )


if __name__ == "__main__":
    sys.exit(main())
