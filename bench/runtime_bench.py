"""Runtime benchmark: Receipt no-op jobs end to end against plain Celery no-op tasks, in one run.

    .venv/bin/python -m bench.runtime_bench [--jobs 1000] [--clients 4] [--idle 50]

(A) Receipt: a fresh Postgres database, migrated; real processes — gunicorn (the API), a
``driver`` and a ``worker-chat`` (``RECEIPT_HANDLER_MODULES=devharness.handlers``: agent ``noop``
returns ``{}``) on Redis. A load generator in a second process posts N jobs over HTTP from a few
keep-alive clients; the run ends when every job is ``completed`` (polled in the jobs table).
Latency per job is ``job.enqueued`` -> ``job.completed``, both receipt times (database clock).
An idle run then sends jobs one at a time, each after the previous one completed.

(B) Plain Celery: a minimal app with a no-op task on the same Redis (another database number) and
a Postgres result backend on a fresh database; a ``--pool threads`` worker with the same
concurrency as the Receipt worker; N tasks sent, done when N results are stored. It runs before
and after (A) and the two are averaged, so load drifting during the run favours neither side.

Throughput for both is N / (first send -> completion observed by the same 10 ms poll), so the
ratio compares like with like. To show where the time goes it also prints: CPU milliseconds per
job of each process (from /proc), the median time of each step between enqueue and completion
(database clock), and an in-process profile of one job (statements, commits, pooled-connection
checkouts — each a pre-ping round trip — and broker messages per step).

Every process started here is stopped by its PID; both databases are dropped; the two Redis
databases used (6 and 7 by default) are flushed before and after.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from celery import Celery

from app.composition import queue_for
from app.jobs.ids import qualify
from app.jobs.validation import EnqueueRequest
from app.jobs.vocab import job_stream
from app.storage.queue import EnqueueResult, Queue
from devharness.credits import offer_slots
from devharness.databases import new_database
from devharness.processes import Harness, base_env
from devharness.waiting import free_port, wait_for

REPO = Path(__file__).resolve().parent.parent
PG_ADMIN_URL = os.environ.get("BENCH_PG_ADMIN_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres")
REDIS_BASE = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379")
RECEIPT_REDIS_DB = int(os.environ.get("BENCH_RECEIPT_REDIS_DB", "6"))
BASELINE_REDIS_DB = int(os.environ.get("BENCH_BASELINE_REDIS_DB", "7"))
ORG = "bench-org"
AGENT = "noop"
BASELINE_QUEUE = "bench-baseline"
BASELINE_TASK = "bench.noop"
POLL_S = 0.01
STOP_GRACE_S = 20.0


# -- (B) the plain Celery app: ``celery -A bench.runtime_bench:baseline_app worker`` -----------------


def make_baseline_app(broker: str, backend: str) -> Celery:
    """A minimal Celery app: one no-op task, Redis broker, database result backend. Defaults otherwise."""
    app = Celery("bench_baseline", broker=broker, backend=backend, set_as_current=False)
    app.conf.update(
        task_default_queue=BASELINE_QUEUE,
        broker_connection_retry_on_startup=True,
        database_create_tables_at_setup=True,
        worker_hijack_root_logger=False,
    )

    def noop() -> dict[str, Any]:
        return {}

    app.task(name=BASELINE_TASK, shared=False)(noop)

    return app


baseline_app = make_baseline_app(
    os.environ.get("BENCH_CELERY_BROKER", f"{REDIS_BASE}/{BASELINE_REDIS_DB}"),
    os.environ.get("BENCH_CELERY_BACKEND", "db+sqlite:///:memory:"),
)


# -- helpers ------------------------------------------------------------------------------------------


@contextmanager
def fresh_database(prefix: str, template: str | None = None) -> Iterator[str]:
    """A new database on the benchmark's server (empty, or a copy of ``template``), dropped afterwards."""
    from app.storage.db import make_engine

    admin = make_engine(PG_ADMIN_URL)
    try:
        with new_database(admin, prefix, template) as url:
            yield url
    finally:
        admin.dispose()


def wait_until(predicate: Callable[[], Any], timeout: float, what: str, procs: Harness | None = None) -> Any:
    """``wait_for`` at the benchmark's 10 ms poll, giving up early if a process it started died."""
    return wait_for(
        predicate, timeout, interval=POLL_S, what=what, check=procs.check_alive if procs else None
    )


# Receipt's processes log at their production defaults in a bench: the harness turns the per-task
# and per-tick lines on for the tests that read them, which no deployment writes by default.
PRODUCTION_LOGS = {"RECEIPT_LOG_TICKS": "disabled", "RECEIPT_ACCESS_LOG": "disabled"}


def child_env(**extra: str) -> dict[str, str]:
    """A benchmark process's environment: the harness's, without the benchmark's own variables,
    logging as a deployment does (``PRODUCTION_LOGS``)."""
    env = {k: v for k, v in base_env(handlers="devharness.handlers").items() if not k.startswith("BENCH_")}
    env.update(PRODUCTION_LOGS)
    env.update(extra)
    return env


def flush_redis(db: int) -> None:
    import redis

    client = redis.Redis.from_url(f"{REDIS_BASE}/{db}")
    try:
        client.flushdb()
    finally:
        client.close()


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, user+system CPU seconds) of a live process, from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / _CLK_TCK


def tree_cpu(root: int) -> float:
    """CPU seconds used so far by a process and its live descendants (e.g. gunicorn's workers)."""
    stats = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _proc_stat(int(entry))
            if st is not None:
                stats[int(entry)] = st
    total, frontier = 0.0, [root]
    while frontier:
        pid = frontier.pop()
        if pid in stats:
            total += stats[pid][1]
            frontier.extend(child for child, (ppid, _) in stats.items() if ppid == pid)
    return total


def backend_pids(engine: Any) -> list[int]:
    """Postgres backend pids connected to this engine's database (its pools' connections)."""
    from sqlalchemy import text

    with engine.connect() as conn:
        return [
            int(p)
            for p in conn.execute(
                text(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> "
                    "pg_backend_pid()"
                )
            ).scalars()
        ]


class CpuMeter:
    """CPU seconds per named group of processes between ``start`` and ``stop``.

    Postgres backends are found by database; one that connects after ``start`` counts from zero
    and one that disconnects before ``stop`` is missed, so the Postgres figure is approximate.
    """

    def __init__(self, groups: dict[str, Callable[[], list[int]]]) -> None:
        self.groups = groups
        self.before: dict[str, dict[int, float]] = {}
        self.used: dict[str, float] = {}

    def _sample(self) -> dict[str, dict[int, float]]:
        return {name: {pid: tree_cpu(pid) for pid in pids()} for name, pids in self.groups.items()}

    def start(self) -> None:
        self.before = self._sample()

    def stop(self) -> dict[str, float]:
        after = self._sample()
        self.used = {
            name: sum(cpu - self.before[name].get(pid, 0.0) for pid, cpu in after[name].items())
            for name in self.groups
        }
        return self.used


def percentile(values: list[float], p: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), round(p / 100 * len(ordered) + 0.5)))
    return ordered[rank - 1]


# -- the load generator (a second process) --------------------------------------------------------------


def job_body(job_id: str) -> dict[str, Any]:
    return {
        "jobId": job_id,
        "payload": {"kind": "factory.run", "authContext": {"userId": "bench", "organizationId": ORG}},
    }


def loadgen(url: str, token: str, jobs: int, clients: int, prefix: str) -> dict[str, Any]:
    """Post ``jobs`` enqueues from ``clients`` keep-alive sessions; report start/end wall times."""
    import requests

    ids = [f"{prefix}{i:06d}" for i in range(jobs)]
    shares = [ids[i::clients] for i in range(clients)]
    errors: list[str] = []
    sessions = [requests.Session() for _ in range(clients)]
    headers = {"Authorization": f"Bearer {token}"}
    for s in sessions:  # open each keep-alive connection before the clock starts
        s.get(f"{url}/healthz", timeout=10)
    barrier = threading.Barrier(clients + 1)

    def client(session: requests.Session, share: list[str]) -> None:
        barrier.wait()
        for job_id in share:
            r = session.post(f"{url}/agents/{AGENT}/jobs", json=job_body(job_id), headers=headers, timeout=30)
            if r.status_code != 202:
                errors.append(f"{job_id}: {r.status_code} {r.text[:200]}")

    threads = [
        threading.Thread(target=client, args=(s, share)) for s, share in zip(sessions, shares, strict=True)
    ]
    for t in threads:
        t.start()
    start = time.time()
    barrier.wait()
    for t in threads:
        t.join()
    end = time.time()
    return {"start": start, "end": end, "errors": errors[:10], "errorCount": len(errors)}


# -- (A) Receipt --------------------------------------------------------------------------------------


@dataclass
class ReceiptFigures:
    throughput: float
    db_span_throughput: float
    enqueue_rate: float
    p50_ms: float
    p99_ms: float
    idle_p50_ms: float
    idle_p99_ms: float
    load_segments: list[float]
    idle_segments: list[float]
    cpu_ms_per_job: dict[str, float]


def latencies_ms(engine: Any, prefix: str) -> list[float]:
    from sqlalchemy import text

    with engine.connect() as conn:
        rows = (
            conn.execute(
                text(
                    "SELECT EXTRACT(EPOCH FROM (c.at - e.at)) * 1000 FROM receipts e JOIN receipts c "
                    "ON c.stream = e.stream AND c.type = 'job.completed' "
                    "WHERE e.type = 'job.enqueued' AND e.stream LIKE :p"
                ),
                {"p": job_stream(f"{prefix}%")},
            )
            .scalars()
            .all()
        )
    return [float(v) for v in rows]


SEGMENTS = (
    "enqueued -> delivery recorded (wake hop, dispatch scan)",
    "delivery recorded -> job.leased (drive, worker hop, lease)",
    "job.leased -> job.heartbeat (start fence, same commit)",
    "job.heartbeat -> job.completed (handler, re-read, settle)",
)


def segments_ms(engine: Any, prefix: str) -> list[float]:
    """Median milliseconds of each step between a job's enqueue and its completion (database clock)."""
    from sqlalchemy import text

    with engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT e.at, d.created_at, l.at, h.at, c.at FROM receipts e "
                "JOIN deliveries d ON d.dispatch_key = substr(e.stream, 6) AND d.generation = 0 "
                "JOIN receipts l ON l.stream = e.stream AND l.type = 'job.leased' "
                "JOIN receipts h ON h.stream = e.stream AND h.type = 'job.heartbeat' "
                "JOIN receipts c ON c.stream = e.stream AND c.type = 'job.completed' "
                "WHERE e.type = 'job.enqueued' AND e.stream LIKE :p"
            ),
            {"p": job_stream(f"{prefix}%")},
        ).all()
    if not rows:
        return []
    return [statistics.median((r[i + 1] - r[i]).total_seconds() * 1000 for r in rows) for i in range(4)]


def count_status(engine: Any, prefix: str) -> dict[str, int]:
    from sqlalchemy import text

    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT status, count(*) FROM jobs WHERE id LIKE :p GROUP BY status"),
            {"p": f"{prefix}%"},
        ).all()
    return {str(s): int(n) for s, n in rows}


def run_receipt(
    args: argparse.Namespace, procs: Harness, home: Path, extra_env: dict[str, str] | None = None
) -> ReceiptFigures:
    import requests

    from app.storage import tokens
    from app.storage.db import make_engine
    from app.storage.migrate import upgrade

    with fresh_database("receipt_bench") as url:
        engine = make_engine(url)
        try:
            upgrade(engine)
            _, token = tokens.create(engine, ORG)
            port = free_port()
            base = f"http://127.0.0.1:{port}"
            env = child_env(
                DATABASE_URL=url,
                REDIS_URL=f"{REDIS_BASE}/{RECEIPT_REDIS_DB}",
                RECEIPT_HOME=str(home),
                RECEIPT_RATE_LIMIT_WRITES="disabled",  # throughput, not the write limit, is measured
                RECEIPT_RESONATE_EXECUTE_CONCURRENCY=str(args.concurrency),
                **dict(setting.split("=", 1) for setting in args.setting),
                **(extra_env or {}),
            )
            py = sys.executable
            procs.start(
                "api",
                [
                    py,
                    "-m",
                    "gunicorn",
                    "-c",
                    "python:api.gunicorn_conf",
                    "--bind",
                    f"127.0.0.1:{port}",
                    "api.wsgi:app",
                ],
                env,
            )
            procs.start("driver", [py, "-m", "tasks.worker", "--role", "driver"], env)
            procs.start("worker-chat", [py, "-m", "tasks.worker", "--role", "worker-chat"], env)

            def healthy() -> bool:
                try:
                    return requests.get(f"{base}/healthz", timeout=2).status_code == 200
                except requests.RequestException:
                    return False

            wait_until(healthy, 60, "the API", procs)
            session = requests.Session()
            headers = {"Authorization": f"Bearer {token}"}

            def post(job_id: str) -> None:
                r = session.post(
                    f"{base}/agents/{AGENT}/jobs", json=job_body(job_id), headers=headers, timeout=30
                )
                if r.status_code != 202:
                    raise RuntimeError(f"enqueue answered {r.status_code}: {r.text[:300]}")

            # Warm-up: proves driver and worker consume, and fills every connection pool.
            for i in range(args.warmup):
                post(f"warm-{i:04d}")
            wait_until(
                lambda: count_status(engine, qualify(ORG, "warm-")).get("completed", 0) == args.warmup,
                60,
                "the warm-up jobs",
                procs,
            )
            log(f"receipt: processes up, {args.warmup} warm-up jobs completed")

            # Load: N jobs from a second process with a few keep-alive clients.
            pids = {proc.name: proc.pid for proc in procs.procs}
            meter = CpuMeter(
                {
                    "api (gunicorn)": lambda: [pids["api"]],
                    "driver": lambda: [pids["driver"]],
                    "worker-chat": lambda: [pids["worker-chat"]],
                    "postgres": lambda: backend_pids(engine),
                }
            )
            meter.start()
            gen = subprocess.run(
                [
                    py,
                    "-m",
                    "bench.runtime_bench",
                    "loadgen",
                    "--url",
                    base,
                    "--token",
                    token,
                    "--jobs",
                    str(args.jobs),
                    "--clients",
                    str(args.clients),
                    "--prefix",
                    "load-",
                ],
                cwd=REPO,
                env=child_env(),
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            if gen.returncode != 0:
                raise RuntimeError(f"load generator failed: {gen.stderr[-2000:]}")
            sent = json.loads(gen.stdout.strip().splitlines()[-1])
            if sent["errorCount"]:
                raise RuntimeError(f"{sent['errorCount']} enqueues failed, e.g. {sent['errors']}")

            def all_done() -> bool:
                counts = count_status(engine, qualify(ORG, "load-"))
                bad = {k: v for k, v in counts.items() if k in ("failed", "canceled")}
                if bad:
                    raise RuntimeError(f"jobs ended badly: {counts}")
                return bool(counts.get("completed", 0) == args.jobs)

            wait_until(all_done, 300, f"{args.jobs} jobs to complete", procs)
            done_wall = time.time()
            cpu = meter.stop()
            lat = latencies_ms(engine, qualify(ORG, "load-"))
            from sqlalchemy import text

            with engine.connect() as conn:
                span_s = float(
                    conn.execute(
                        text(
                            "SELECT EXTRACT(EPOCH FROM (max(c.at) - min(e.at))) FROM receipts e JOIN "
                            "receipts c "
                            "ON c.stream = e.stream AND c.type = 'job.completed' "
                            "WHERE e.type = 'job.enqueued' AND e.stream LIKE :p"
                        ),
                        {"p": job_stream(f"{qualify(ORG, 'load-')}%")},
                    ).scalar_one()
                )

            # Idle: one job at a time, each sent after the previous one completed.
            for i in range(args.idle):
                job_id = f"idle-{i:04d}"
                post(job_id)
                done = functools.partial(_is_completed, engine, qualify(ORG, job_id))
                wait_until(done, 30, f"idle job {job_id}", procs)
            idle = latencies_ms(engine, qualify(ORG, "idle-")) or [float("nan")]
            return ReceiptFigures(
                throughput=args.jobs / (done_wall - sent["start"]),
                db_span_throughput=args.jobs / span_s,
                enqueue_rate=args.jobs / (sent["end"] - sent["start"]),
                p50_ms=statistics.median(lat),
                p99_ms=percentile(lat, 99),
                idle_p50_ms=statistics.median(idle),
                idle_p99_ms=percentile(idle, 99),
                load_segments=segments_ms(engine, qualify(ORG, "load-")),
                idle_segments=segments_ms(engine, qualify(ORG, "idle-")) if args.idle else [],
                cpu_ms_per_job={k: v * 1000 / args.jobs for k, v in cpu.items()},
            )
        finally:
            procs.stop_all()
            engine.dispose()


def _is_completed(engine: Any, job_id: str) -> bool:
    return _status(engine, job_id) == "completed"


def _status(engine: Any, job_id: str) -> str | None:
    from sqlalchemy import text

    with engine.connect() as conn:
        value = conn.execute(text("SELECT status FROM jobs WHERE id = :i"), {"i": job_id}).scalar()
    return str(value) if value is not None else None


# -- (B) plain Celery ---------------------------------------------------------------------------------


def run_baseline(args: argparse.Namespace, procs: Harness) -> tuple[float, dict[str, float]]:
    from sqlalchemy import create_engine, text

    with fresh_database("celery_bench") as url:
        broker = f"{REDIS_BASE}/{BASELINE_REDIS_DB}"
        backend = f"db+{url}"
        env = child_env(BENCH_CELERY_BROKER=broker, BENCH_CELERY_BACKEND=backend)
        procs.start(
            "celery-baseline",
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "bench.runtime_bench:baseline_app",
                "worker",
                "--pool",
                "threads",
                "--concurrency",
                str(args.concurrency),
                "--queues",
                BASELINE_QUEUE,
                "--without-gossip",
                "--without-mingle",
                "--loglevel",
                "WARNING",
            ],
            env,
        )
        app = make_baseline_app(broker, backend)
        engine = create_engine(url)
        try:

            def stored() -> int:
                try:
                    with engine.connect() as conn:
                        return int(
                            conn.execute(
                                text("SELECT count(*) FROM celery_taskmeta WHERE status = 'SUCCESS'")
                            ).scalar_one()
                        )
                except Exception:  # the worker creates the table on its first result
                    return 0

            for _ in range(args.warmup):
                app.send_task(BASELINE_TASK, queue=BASELINE_QUEUE)
            wait_until(lambda: stored() >= args.warmup, 60, "the baseline warm-up", procs)
            log(f"celery: worker up, {args.warmup} warm-up tasks stored")
            worker_pid = procs.procs[-1].pid
            meter = CpuMeter(
                {
                    "worker": lambda: [worker_pid],
                    "producer (this process)": lambda: [os.getpid()],
                    "postgres": lambda: backend_pids(engine),
                }
            )
            meter.start()
            start = time.time()
            for _ in range(args.jobs):
                app.send_task(BASELINE_TASK, queue=BASELINE_QUEUE)
            wait_until(lambda: stored() >= args.warmup + args.jobs, 300, f"{args.jobs} baseline tasks", procs)
            tps = args.jobs / (time.time() - start)
            cpu = meter.stop()
            return tps, {k: v * 1000 / args.jobs for k, v in cpu.items()}
        finally:
            procs.stop_all()
            engine.dispose()
            app.close()


# -- profile: one job through the real code path, in-process, counting database work per step ----------

PROFILE_JOBS = 30


def profile_one_job() -> list[tuple[str, dict[str, float]]]:
    """Per step of a no-op job (enqueue, dispatch, driver, worker), through the real code in-process.

    Counts (statements, commits, rollbacks, pooled-connection checkouts, broker messages) are per
    job; ``cpu_ms`` is the median CPU time of Receipt's own Python for the step over
    ``PROFILE_JOBS`` jobs — comparing it with each process's CPU per job in the real run shows what
    Celery itself costs around it.
    """
    from sqlalchemy import event

    from app.config import Settings
    from app.jobs.routing import EXECUTE_TASK
    from app.jobs.validation import validate_enqueue
    from app.storage.db import make_engine
    from app.storage.migrate import upgrade
    from delivery import dispatch
    from delivery.callbacks import Callbacks
    from delivery.client import DeliveryClient
    from devharness import handlers
    from tasks.celery_app import make_celery
    from workers import attempts
    from workers.registry import HandlerRegistry
    from workers.runtime import Runtime

    sent: list[tuple[str, list[Any]]] = []
    counts = {"statements": 0, "commits": 0, "rollbacks": 0, "checkouts": 0}

    def bump(name: str) -> Callable[..., None]:
        return lambda *_a, **_k: counts.__setitem__(name, counts[name] + 1)

    with fresh_database("receipt_profile") as url:
        engine = make_engine(url)
        try:
            upgrade(engine)
            # A live worker's slots, as the Procfile's chat worker offers them: the pass sends to them.
            offer_slots(engine, slots=8)
            event.listen(engine, "before_cursor_execute", bump("statements"))
            event.listen(engine, "commit", bump("commits"))
            event.listen(engine, "rollback", bump("rollbacks"))
            # Each checkout of a pooled Postgres connection costs a pre-ping round trip
            # (app.storage.db.make_engine).
            event.listen(engine.pool, "checkout", bump("checkouts"))
            settings = Settings.from_env({"REDIS_URL": f"{REDIS_BASE}/{RECEIPT_REDIS_DB}"})
            app = make_celery(settings)
            app.send_task = lambda name, args=None, **kw: sent.append((name, list(args or [])))
            registry = HandlerRegistry()
            handlers.register(registry)
            client = DeliveryClient(app)
            queue = queue_for(engine, on_dispatchable=client.wake)
            rt = Runtime(
                settings=settings,
                app=app,
                engine=engine,
                queue=queue,
                registry=registry,
                callbacks=Callbacks(settings),
                delivery=client,
            )
            names = (
                "api: enqueue (+ wake message; + 1 ledger write)",
                "driver: dispatch scan -> start_driver -> drive -> worker message",
                "worker: execute (lease+start, run, settle; + 2 ledger writes)",
            )
            deltas: dict[str, dict[str, int]] = {}
            cpu: dict[str, list[float]] = {n: [] for n in names}

            def step(name: str, fn: Callable[[], Any]) -> None:
                before = dict(counts)
                messages = len(sent)
                started = time.thread_time()
                fn()
                cpu[name].append((time.thread_time() - started) * 1000)
                deltas[name] = {k: counts[k] - before[k] for k in counts}
                deltas[name]["messages"] = len(sent) - messages

            for i in range(PROFILE_JOBS):
                req = validate_enqueue(AGENT, job_body(f"profile-{i}"))
                sent.clear()
                made: list[EnqueueResult] = []
                step(names[0], functools.partial(_enqueue_into, queue, req, made))
                job_id = made[0].job.id  # the organisation-qualified key the driver and worker use
                step(names[1], functools.partial(dispatch.dispatch_jobs, rt, [job_id]))
                # The wake-up's scan drives in-process: the worker message is its only send.
                _, fence, key, generation = next(a for n, a in sent if n == EXECUTE_TASK)
                step(names[2], functools.partial(attempts.execute, rt, job_id, fence, key, generation))
            return [(n, {**deltas[n], "cpu_ms": statistics.median(cpu[n])}) for n in names]
        finally:
            engine.dispose()


def _enqueue_into(queue: Queue, req: EnqueueRequest, made: list[EnqueueResult]) -> None:
    made.append(queue.enqueue(req))


# -- main ---------------------------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def off_path_ns(calls: int = 200_000) -> float:
    """What tracing costs a job while it is off, in-process: the checks a job's path makes (the
    enqueue's context lookup, and about ten ``tracing.on()`` checks across the web, the driver,
    the worker and log lines), in ns per job."""
    from app import tracing

    tracing.reset()
    assert not tracing.on()
    started = time.perf_counter_ns()
    for _ in range(calls):
        tracing.enqueue_context()
        for _check in range(10):
            tracing.on()
    return (time.perf_counter_ns() - started) / calls


def tracing_ab(args: argparse.Namespace) -> int:
    """Receipt's CPU per job with tracing off and on, rounds alternated in one run (medians)."""
    from devharness.otlp import OtlpReceiver

    receiver = OtlpReceiver().start()
    arms: dict[str, dict[str, str]] = {"off": {}, "on": {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}}
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    tps: dict[str, list[float]] = {"off": [], "on": []}
    try:
        with tempfile.TemporaryDirectory(prefix="receipt-bench-") as tmp:
            procs = Harness(Path(tmp) / "logs", grace=STOP_GRACE_S)
            try:
                for round_ in range(args.tracing_ab):
                    for arm in ("off", "on") if round_ % 2 == 0 else ("on", "off"):
                        flush_redis(RECEIPT_REDIS_DB)
                        log(f"round {round_ + 1}: tracing {arm}, {args.jobs} jobs")
                        home = Path(tmp) / f"home-{round_}-{arm}"
                        figures = run_receipt(args, procs, home, arms[arm])
                        total = sum(figures.cpu_ms_per_job.values())
                        cpu[arm].append(total)
                        tps[arm].append(figures.throughput)
                        log(f"  CPU {total:.2f} ms/job, {figures.throughput:.1f} jobs/s")
            finally:
                procs.stop_all()
                flush_redis(RECEIPT_REDIS_DB)
        spans = len(receiver.spans())
    finally:
        receiver.close()
    off, on = statistics.median(cpu["off"]), statistics.median(cpu["on"])
    print()
    print(
        f"Tracing A/B: {args.tracing_ab} rounds alternated, {args.jobs} no-op jobs each, {args.clients} "
        f"HTTP clients, concurrency {args.concurrency}, {os.cpu_count()} CPUs"
    )
    print(f"  CPU ms per job (api + driver + worker-chat + postgres), median: off {off:.2f}, on {on:.2f}")
    print(f"  tracing on / off: {on / off:.3f}  (target <= 1.10); rounds off {cpu['off']}, on {cpu['on']}")
    print(
        f"  throughput jobs/s, median: off {statistics.median(tps['off']):.1f}, "
        f"on {statistics.median(tps['on']):.1f}"
    )
    print(f"  spans the OTLP receiver decoded: {spans}")
    print(f"  tracing off, in-process: {off_path_ns():.0f} ns per job of checks (a job costs ms of CPU)")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.runtime_bench")
    sub = parser.add_subparsers(dest="command")
    gen = sub.add_parser("loadgen", help="(internal) the load generator process")
    gen.add_argument("--url", required=True)
    gen.add_argument("--token", required=True)
    gen.add_argument("--jobs", type=int, required=True)
    gen.add_argument("--clients", type=int, required=True)
    gen.add_argument("--prefix", required=True)
    parser.add_argument("--jobs", type=int, default=1000, help="jobs (and baseline tasks) in the load run")
    parser.add_argument("--clients", type=int, default=4, help="concurrent keep-alive HTTP clients")
    parser.add_argument("--idle", type=int, default=50, help="jobs in the one-at-a-time idle latency run")
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument(
        "--concurrency",
        type=int,
        default=8,
        help="threads of the Receipt driver and worker, and of the Celery worker",
    )
    parser.add_argument(
        "--setting",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a Receipt setting for every Receipt process (repeatable), e.g. RECEIPT_GROUP_COMMIT_MAX=1",
    )
    parser.add_argument(
        "--tracing-ab",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="instead of the comparison: Receipt with tracing off and on (OTLP/HTTP to a receiver on "
        "loopback), ROUNDS rounds alternating which goes first; medians of CPU ms per job",
    )
    args = parser.parse_args(argv)
    bad = [s for s in args.setting if "=" not in s or not s.startswith("RECEIPT_")]
    if bad:
        parser.error(f"--setting takes RECEIPT_NAME=VALUE, got {bad}")

    if args.command == "loadgen":
        print(json.dumps(loadgen(args.url, args.token, args.jobs, args.clients, args.prefix)))
        return 0

    if args.tracing_ab:
        return tracing_ab(args)
    for db in (RECEIPT_REDIS_DB, BASELINE_REDIS_DB):
        flush_redis(db)
    with tempfile.TemporaryDirectory(prefix="receipt-bench-") as tmp:
        home = Path(tmp)
        procs = Harness(home / "logs", grace=STOP_GRACE_S)
        try:
            log("profiling one job in-process")
            steps = profile_one_job()
            # Plain Celery runs before and after Receipt and the two are averaged, so a load that
            # drifts during the run (other work on the machine) does not favour either side.
            log(f"(B1) plain Celery: {args.jobs} tasks, threads pool, concurrency {args.concurrency}")
            celery_before, celery_cpu = run_baseline(args, procs)
            log(f"(A) Receipt: {args.jobs} jobs, {args.clients} HTTP clients, concurrency {args.concurrency}")
            receipt = run_receipt(args, procs, home)
            log(f"(B2) plain Celery again: {args.jobs} tasks")
            celery_after, _ = run_baseline(args, procs)
            celery_tps = (celery_before + celery_after) / 2
        finally:
            procs.stop_all()
            for db in (RECEIPT_REDIS_DB, BASELINE_REDIS_DB):
                flush_redis(db)

    ratio = receipt.throughput / celery_tps
    print()
    print(
        f"Runtime benchmark: {args.jobs} no-op jobs, {args.clients} HTTP clients, concurrency "
        f"{args.concurrency}, "
        f"{os.cpu_count()} CPUs"
    )
    print(
        f"  Receipt (HTTP enqueue -> completed)   {receipt.throughput:8.1f} jobs/s"
        f"   (receipt-time span {receipt.db_span_throughput:.1f} jobs/s; HTTP enqueue "
        f"{receipt.enqueue_rate:.1f}/s)"
    )
    print(
        f"  plain Celery (PG result backend)      {celery_tps:8.1f} tasks/s"
        f"   (mean of {celery_before:.1f} before and {celery_after:.1f} after Receipt)"
    )
    print(f"  ratio Receipt / Celery                {ratio:8.2f}   (target >= 0.5)")
    print(f"  latency under load  p50 {receipt.p50_ms:7.1f} ms   p99 {receipt.p99_ms:7.1f} ms")
    print(
        f"  latency idle        p50 {receipt.idle_p50_ms:7.1f} ms   p99 {receipt.idle_p99_ms:7.1f} ms"
        f"   (target p50 <= 50 ms, {args.idle} jobs one at a time)"
    )
    print("  CPU ms per job while loaded (the machine has 2 cores, so CPU bounds throughput):")
    print(
        "    Receipt: "
        + ", ".join(f"{k} {v:.1f}" for k, v in receipt.cpu_ms_per_job.items())
        + f"; total {sum(receipt.cpu_ms_per_job.values()):.1f}"
    )
    print(
        "    Celery:  "
        + ", ".join(f"{k} {v:.1f}" for k, v in celery_cpu.items() if k != "postgres")
        + f"; total {sum(celery_cpu.values()):.1f} + postgres (not measurable: its result backend opens"
        " a connection per write under the threads pool)"
    )
    print("  where an enqueue-to-completed goes (median ms per step, database clock):       idle    load")
    for name, idle_ms, load_ms in zip(SEGMENTS, receipt.idle_segments, receipt.load_segments, strict=False):
        print(f"    {name:<75} {idle_ms:7.1f} {load_ms:7.1f}")
    print(
        "  one job's work by step (in-process, real code; a checkout = one pre-ping round trip;"
        " cpu = Receipt's own Python):"
    )
    print(
        f"    {'':<70} {'stmts':>6} {'commits':>8} {'rollbks':>8} {'checkouts':>10} {'messages':>9}"
        f" {'cpu ms':>7}"
    )
    keys = ("statements", "commits", "rollbacks", "checkouts", "messages", "cpu_ms")
    for name, d in [*steps, ("total", {k: sum(d[k] for _, d in steps) for k in keys})]:
        print(
            f"    {name:<70} {d['statements']:6.0f} {d['commits']:8.0f} {d['rollbacks']:8.0f}"
            f" {d['checkouts']:10.0f} {d['messages']:9.0f} {d['cpu_ms']:7.1f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
