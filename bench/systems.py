"""The systems ``bench.compare`` measures, one class each: Receipt (Python and HTTP enqueue),
Procrastinate, Celery and the floors of ``bench/floor.py``.

A ``System`` says how it is started on the fresh database ``bench.compare`` made for it (its
processes, the CPU groups to sample, the producer's environment), how a producer sends it one job
and sees it done, how it sends many at once where it has a bulk path of its own, and how its own
records say how many jobs of a batch completed and when. Every system is driven the same way, by
``bench.compare``: what differs between them is all here.
"""

from __future__ import annotations

import os
import subprocess
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import UTC
from pathlib import Path
from typing import Any

from sqlalchemy import text
from sqlalchemy.engine import Connection, Engine

from app.composition import queue_for
from app.config import switch
from app.jobs.ids import qualify
from app.storage.queue import Queue
from bench.runtime_bench import (
    AGENT,
    BASELINE_QUEUE,
    BASELINE_TASK,
    PRODUCTION_LOGS,
    child_env,
    latencies_ms,
    make_baseline_app,
)
from devharness.processes import PYTHON, Harness
from devharness.services import RedisServer
from devharness.stack import ORG, make_stack

BOOT_TIMEOUT_S = 120.0

# In the producer: (send one job -> the key it is known by, is that key's job done?).
Sender = tuple[Callable[[str], str], Callable[[str], bool]]
# In the producer: send a batch of jobs in one call -> their keys, in order.
BulkSender = Callable[[list[str]], list[str]]


def job_body(job_id: str) -> dict[str, Any]:
    """A no-op job of the deployment's organisation (the one its API token belongs to)."""
    return {
        "jobId": job_id,
        "payload": {"kind": "factory.run", "authContext": {"userId": "bench", "organizationId": ORG}},
    }


def receipt_key(job_id: str) -> str:
    """Receipt's storage key (and, after ``jobs/``, stream) of a client's job id (or of an id prefix)."""
    return qualify(ORG, job_id)


def sa_to_libpq(url: str) -> str:
    return url.replace("postgresql+psycopg2://", "postgresql://", 1)


def scalar(engine: Engine, sql: str, key: Any) -> Any:
    with engine.connect() as conn:
        return conn.execute(text(sql), {"k": key}).scalar()


# -- deployments ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Database:
    """The fresh database a system is deployed on, and how to find its backends' pids."""

    url: str
    name: str
    engine: Engine
    postgres: Callable[[], list[int]]


@dataclass(frozen=True)
class Deployment:
    """One running system on its own database: how to produce into it and what to measure."""

    system: System  # the one that started it (Receipt's two enqueue paths share one deployment)
    url: str
    engine: Engine
    database: str
    cpu_groups: dict[str, Callable[[], list[int]]]
    producer_env: dict[str, str] = field(default_factory=dict)

    @classmethod
    def on(
        cls,
        system: System,
        db: Database,
        cpu_groups: dict[str, Callable[[], list[int]]],
        producer_env: dict[str, str],
    ) -> Deployment:
        return cls(system, db.url, db.engine, db.name, cpu_groups, producer_env)


@dataclass(frozen=True)
class Target:
    """One throughput target: this system's jobs/s at least ``least`` times ``peer``'s."""

    claim: str
    peer: str
    least: float


def _pids(*pids: int) -> Callable[[], list[int]]:
    return lambda: list(pids)


# -- the systems ------------------------------------------------------------------------------------


class System(ABC):
    """One system the comparison runs: how it is started, how a producer sends it a job, and how
    its own records say how many jobs completed and when.

    Every system is measured the same way (``run_round``): the producer sends single jobs from its
    threads, so a system's CPU groups, its done count and its timings are all that differ. The bulk
    phase (``run_bulk_round``) sends whole batches through ``bulk_sender`` the same way.
    """

    name: str  # as ``--systems`` spells it
    label: str  # its row in the table
    # Its deployment: systems of one kind run on the same processes (Receipt's two enqueue paths),
    # and share one deployment in the statement count.
    kind: str
    # CPU groups that sit idle in this system's runs, left out of its figure.
    idle_groups: tuple[str, ...] = ()
    targets: tuple[Target, ...] = ()
    # the latency targets apply: idle p50 <= 8 ms, loaded p99 <= 100 ms.
    latency_targets = False
    # Its row in the bulk table (``bulk_sender``); None: no bulk path, left out of the bulk phase.
    bulk_label: str | None = None
    # The bulk phase also sends the same jobs one at a time (a row labelled ``label``): the peer a
    # bulk target is compared with at the faster of its two ways of sending many jobs.
    bulk_singles = False

    @abstractmethod
    def start(
        self, stack: ExitStack, harness: Harness, home: Path, db: Database, *, prepared: bool
    ) -> Deployment:
        """Start the system's processes on ``db`` and wait until they are up; their stops go on ``stack``."""

    @abstractmethod
    def done_count(self, conn: Connection, prefix: str, result: dict[str, Any]) -> int:
        """Jobs of the batch ``prefix`` (``result``: what the producer sent) completed so far."""

    @abstractmethod
    def timings(
        self, dep: Deployment, conn: Connection, prefix: str, result: dict[str, Any]
    ) -> tuple[list[float], float]:
        """(latencies in ms, span in s from the first enqueue to the last completion) of a batch."""

    @abstractmethod
    def sender(self, engine: Engine, prefix: str) -> Sender:
        """In the producer process: send one job, and see whether it is done (from the environment)."""

    def bulk_sender(self, engine: Engine, prefix: str) -> BulkSender:
        """In the producer process: send many jobs in one call, the system's own bulk path (only
        where ``bulk_label`` is set)."""
        raise NotImplementedError(f"{self.name} has no bulk path")

    def producer_prepared(self) -> bool:
        """Whether the producer's engine uses prepared statements."""
        return False

    def warmed_by(self) -> System:
        """The system whose producer sends the warm-up jobs of this one's deployment."""
        return self


def _receipts_timings(dep: Deployment, conn: Connection, prefix: str) -> tuple[list[float], float]:
    """Timings from the receipts table: ``job.enqueued`` to ``job.completed`` (database clock) of the
    jobs whose keys start with ``prefix`` (their streams with ``jobs/<prefix>``)."""
    lat = latencies_ms(dep.engine, prefix)
    span = conn.execute(
        text(
            "SELECT EXTRACT(EPOCH FROM (max(c.at) - min(e.at))) FROM receipts e JOIN receipts c "
            "ON c.stream = e.stream AND c.type = 'job.completed' "
            "WHERE e.type = 'job.enqueued' AND e.stream LIKE :p"
        ),
        {"p": f"jobs/{prefix}%"},
    ).scalar_one()
    return lat, float(span)


# Settings for Receipt's processes in this run (``compare.py --setting``), over its defaults.
RECEIPT_SETTINGS: dict[str, str] = {}


class Receipt(System):
    """Receipt's real processes: gunicorn, a driver and a ``worker-chat`` running the no-op agent."""

    kind = "receipt"
    latency_targets = True

    def warmed_by(self) -> System:
        return RECEIPT_PYTHON  # either enqueue path's deployment is warmed through Queue.enqueue

    def start(
        self, stack: ExitStack, harness: Harness, home: Path, db: Database, *, prepared: bool
    ) -> Deployment:
        from app.storage.migrate import upgrade

        upgrade(db.engine)
        deployment = make_stack(
            harness,
            db.url,
            home / f"receipt-{db.name}",
            RECEIPT_HANDLER_MODULES="devharness.handlers",
            RECEIPT_RESONATE_EXECUTE_CONCURRENCY="8",
            # A throughput bench posts faster than the default per-organisation write limit allows.
            RECEIPT_RATE_LIMIT_WRITES="1000000/minute",
            # Tuned for a direct PostgreSQL connection, as a deployment without a transaction-mode
            # pooler would be (docs/scaling.md); --unprepared measures the default.
            RECEIPT_DB_PREPARED_STATEMENTS="enabled" if prepared else "disabled",
            **PRODUCTION_LOGS,
            **RECEIPT_SETTINGS,
        )
        # Production timings (5 min leases, a 15 s redrive with a 30 s minimum age, ...), as every peer
        # runs its own defaults: the e2e tests' short ones rescan and redrive during a burst.
        deployment.timings = {}
        stack.callback(deployment.close)
        stack.callback(harness.stop_all)
        web = deployment.start_web(WEB_CONCURRENCY=os.environ.get("BENCH_WEB_CONCURRENCY", "2"))
        driver = deployment.start_worker("driver")
        worker = deployment.start_worker("worker-chat")
        assert deployment.redis_server is not None and deployment.redis_server.proc is not None
        return Deployment.on(
            self,
            db,
            {
                "api (gunicorn)": _pids(web.pid),
                "driver": _pids(driver.pid),
                "worker": _pids(worker.pid),
                "redis": _pids(deployment.redis_server.proc.pid),
                "postgres": db.postgres,
            },
            {
                "BENCH_DB": db.url,
                "BENCH_REDIS": deployment.redis_url,
                "BENCH_WEB": deployment.url(""),
                "BENCH_TOKEN": deployment.token,
                # The in-process producer opens its engine as the deployment's processes do.
                "BENCH_RECEIPT_PREPARED": "1" if prepared else "0",
            },
        )

    def done_count(self, conn: Connection, prefix: str, result: dict[str, Any]) -> int:
        rows = conn.execute(
            text("SELECT status, count(*) FROM jobs WHERE id LIKE :p GROUP BY status"),
            {"p": f"{receipt_key(prefix)}%"},
        ).all()
        counts = {str(k): int(v) for k, v in rows}
        if counts.get("failed") or counts.get("canceled"):
            raise RuntimeError(f"jobs ended badly: {counts}")
        return counts.get("completed", 0)

    def timings(
        self, dep: Deployment, conn: Connection, prefix: str, result: dict[str, Any]
    ) -> tuple[list[float], float]:
        return _receipts_timings(dep, conn, receipt_key(prefix))

    def done_check(self, engine: Engine) -> Callable[[str], bool]:
        """The producer's check that one job completed (either enqueue path)."""
        return lambda k: (
            scalar(engine, "SELECT status FROM jobs WHERE id = :k", receipt_key(k)) == "completed"
        )


class ReceiptPython(Receipt):
    """The producer calls ``Queue.enqueue`` in-process, with the API's own wake-up publisher."""

    name = "receipt-python"
    label = "Receipt, Python enqueue"
    idle_groups = ("api (gunicorn)",)  # no request reaches the API in this variant
    targets = (
        Target("Python enqueue >= 1.0x Procrastinate", "procrastinate", 1.0),
        Target("Python enqueue >= 1.5x Celery", "celery", 1.5),
    )

    bulk_label = "Receipt, Queue.enqueue_many"

    def producer_prepared(self) -> bool:
        return switch(os.environ.get("BENCH_RECEIPT_PREPARED") or "0")

    def queue(self, engine: Engine) -> Queue:
        """The producer's queue, with the API's own wake-up publisher: a commit wakes delivery from
        the queue's hook, as the API's enqueue routes (single and batch) do."""
        from api.wake import default_waker
        from app.config import Settings

        settings = Settings.from_env(
            {"REDIS_URL": os.environ["BENCH_REDIS"], "DATABASE_URL": os.environ["BENCH_DB"]}
        )
        # Configured as every long-lived Receipt process is (api/, workers/runtime.py): ledger rows
        # written off the enqueue's path, batched.
        return queue_for(engine, on_dispatchable=default_waker(settings), ledger_in_background=True)

    def sender(self, engine: Engine, prefix: str) -> Sender:
        from app.jobs.validation import validate_enqueue

        queue = self.queue(engine)

        def send(job_id: str) -> str:
            queue.enqueue(validate_enqueue(AGENT, job_body(job_id)))
            return job_id

        return send, self.done_check(engine)

    def bulk_sender(self, engine: Engine, prefix: str) -> BulkSender:
        from app.jobs.validation import validate_enqueue

        queue = self.queue(engine)

        def send_many(job_ids: list[str]) -> list[str]:
            queue.enqueue_many([validate_enqueue(AGENT, job_body(job_id)) for job_id in job_ids])
            return job_ids

        return send_many


class ReceiptHttp(Receipt):
    """The producer posts ``/agents/noop/jobs`` to gunicorn over keep-alive connections."""

    name = "receipt-http"
    label = "Receipt, HTTP enqueue"
    targets = (
        Target("HTTP enqueue >= 0.7x Procrastinate", "procrastinate", 0.7),
        Target("HTTP enqueue >= 1.0x Celery", "celery", 1.0),
    )
    bulk_label = "Receipt, HTTP POST /jobs:batch"

    def post(self) -> Callable[[str, dict[str, Any]], Any]:
        """POST a JSON body to a path of the deployment's API, with its token, over one keep-alive
        session per producer thread; the response."""
        import requests

        local = threading.local()
        base, token = os.environ["BENCH_WEB"], os.environ["BENCH_TOKEN"]

        def post(path: str, body: dict[str, Any]) -> requests.Response:
            if not hasattr(local, "session"):
                local.session = requests.Session()
            response: requests.Response = local.session.post(
                f"{base}{path}", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30
            )
            if response.status_code != 202:
                raise RuntimeError(f"{response.status_code} {response.text[:200]}")
            return response

        return post

    def sender(self, engine: Engine, prefix: str) -> Sender:
        post = self.post()

        def send(job_id: str) -> str:
            post(f"/agents/{AGENT}/jobs", job_body(job_id))
            return job_id

        return send, self.done_check(engine)

    def bulk_sender(self, engine: Engine, prefix: str) -> BulkSender:
        post = self.post()

        def send_many(job_ids: list[str]) -> list[str]:
            items = [{**job_body(job_id), "agentId": AGENT} for job_id in job_ids]
            jobs = post("/jobs:batch", {"items": items}).json()["jobs"]
            if len(jobs) != len(job_ids) or not all(j.get("created") for j in jobs):
                raise RuntimeError(f"batch of {len(job_ids)}: not every job created: {str(jobs)[:200]}")
            return job_ids

        return send_many


class Procrastinate(System):
    """``procrastinate worker --concurrency 8``; the producer calls ``noop.defer()`` from Python."""

    name = kind = "procrastinate"
    label = "Procrastinate 3, c=8, defer"
    bulk_label = "Procrastinate 3, c=8, batch_defer"
    bulk_singles = True

    def start(
        self, stack: ExitStack, harness: Harness, home: Path, db: Database, *, prepared: bool
    ) -> Deployment:
        dsn = sa_to_libpq(db.url)
        env = child_env(BENCH_PROCRASTINATE_DSN=dsn)
        subprocess.run(
            [PYTHON, "-m", "procrastinate", "--app=bench.peers.procrastinate_app", "schema", "--apply"],
            env=env,
            check=True,
            capture_output=True,
            timeout=BOOT_TIMEOUT_S,
        )
        stack.callback(harness.stop_all)
        worker = harness.start(
            "procrastinate",
            [PYTHON, "-m", "procrastinate", "--app=bench.peers.procrastinate_app", "worker",
             "--concurrency", "8", "--queues", "bench"],
            env,
        )  # fmt: skip
        return Deployment.on(
            self,
            db,
            {"worker": _pids(worker.pid), "postgres": db.postgres},
            {"BENCH_PROCRASTINATE_DSN": dsn, "BENCH_DB": db.url},
        )

    def done_count(self, conn: Connection, prefix: str, result: dict[str, Any]) -> int:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded' AND args->>'tag' = :p"
                ),
                {"p": prefix},
            ).scalar_one()
        )

    def timings(
        self, dep: Deployment, conn: Connection, prefix: str, result: dict[str, Any]
    ) -> tuple[list[float], float]:
        rows = conn.execute(
            text(
                "SELECT d.at, s.at FROM procrastinate_jobs j "
                "JOIN procrastinate_events d ON d.job_id = j.id AND d.type = 'deferred' "
                "JOIN procrastinate_events s ON s.job_id = j.id AND s.type = 'succeeded' "
                "WHERE j.args->>'tag' = :p"
            ),
            {"p": prefix},
        ).all()
        lat = [(s - d).total_seconds() * 1000 for d, s in rows]
        return lat, (max(s for _, s in rows) - min(d for d, _ in rows)).total_seconds()

    def sender(self, engine: Engine, prefix: str) -> Sender:
        from bench.peers import noop, procrastinate_app

        procrastinate_app.open()

        def send(job_id: str) -> str:
            return str(noop.defer(tag=prefix))

        def done(k: str) -> bool:
            return bool(
                scalar(engine, "SELECT status::text FROM procrastinate_jobs WHERE id = :k", int(k))
                == "succeeded"
            )

        return send, done

    def bulk_sender(self, engine: Engine, prefix: str) -> BulkSender:
        from bench.peers import noop, procrastinate_app

        procrastinate_app.open()

        def send_many(job_ids: list[str]) -> list[str]:
            # One statement inserts every job of the call (Procrastinate's documented bulk defer).
            each: list[dict[str, Any]] = [{"tag": prefix} for _ in job_ids]
            return [str(key) for key in noop.batch_defer(*each)]

        return send_many


class Celery(System):
    """``bench.runtime_bench:baseline_app`` (a no-op task), prefork c=2, Redis broker, Postgres results.

    Celery stores no enqueue time: a job's latency runs from the producer's clock before its send."""

    name = kind = "celery"
    label = "Celery prefork c=2, PG results"
    bulk_label = "Celery prefork c=2, group"

    def start(
        self, stack: ExitStack, harness: Harness, home: Path, db: Database, *, prepared: bool
    ) -> Deployment:
        stack.callback(harness.stop_all)
        redis = RedisServer(harness)
        redis.start()
        assert redis.proc is not None
        env = child_env(BENCH_CELERY_BROKER=redis.url, BENCH_CELERY_BACKEND=f"db+{db.url}")
        worker = harness.start(
            "celery",
            [PYTHON, "-m", "celery", "-A", "bench.runtime_bench:baseline_app", "worker", "--pool", "prefork",
             "--concurrency", "2", "--queues", BASELINE_QUEUE, "--without-gossip", "--without-mingle",
             "--loglevel", "WARNING"],
            env,
        )  # fmt: skip
        return Deployment.on(
            self,
            db,
            {
                "worker (+ prefork children)": _pids(worker.pid),
                "redis": _pids(redis.proc.pid),
                "postgres": db.postgres,
            },
            {"BENCH_CELERY_BROKER": redis.url, "BENCH_CELERY_BACKEND": f"db+{db.url}", "BENCH_DB": db.url},
        )

    def done_count(self, conn: Connection, prefix: str, result: dict[str, Any]) -> int:
        try:
            return int(
                conn.execute(
                    text(
                        "SELECT count(*) FROM celery_taskmeta "
                        "WHERE status = 'SUCCESS' AND task_id = ANY(:ids)"
                    ),
                    {"ids": list(result["sent"])},
                ).scalar_one()
            )
        except Exception:  # the worker creates the table with its first result
            return 0

    def timings(
        self, dep: Deployment, conn: Connection, prefix: str, result: dict[str, Any]
    ) -> tuple[list[float], float]:
        sent: dict[str, float] = result["sent"]
        rows = conn.execute(
            text("SELECT task_id, date_done FROM celery_taskmeta WHERE task_id = ANY(:ids)"),
            {"ids": list(sent)},
        ).all()
        done = {tid: (d if d.tzinfo else d.replace(tzinfo=UTC)).timestamp() for tid, d in rows}
        lat = [(done[t] - sent[t]) * 1000 for t in done]
        return lat, max(done.values()) - min(sent.values())

    def sender(self, engine: Engine, prefix: str) -> Sender:
        app = make_baseline_app(os.environ["BENCH_CELERY_BROKER"], os.environ["BENCH_CELERY_BACKEND"])

        def send(job_id: str) -> str:
            return str(app.send_task(BASELINE_TASK, queue=BASELINE_QUEUE).id)

        def done(k: str) -> bool:
            try:
                return bool(
                    scalar(engine, "SELECT status FROM celery_taskmeta WHERE task_id = :k", k) == "SUCCESS"
                )
            except Exception:
                return False

        return send, done

    def bulk_sender(self, engine: Engine, prefix: str) -> BulkSender:
        from celery import group

        app = make_baseline_app(os.environ["BENCH_CELERY_BROKER"], os.environ["BENCH_CELERY_BACKEND"])

        def send_many(job_ids: list[str]) -> list[str]:
            # Celery's bulk path: one producer for the group, still one message per task.
            signatures = [app.signature(BASELINE_TASK, queue=BASELINE_QUEUE) for _ in job_ids]
            return [str(r.id) for r in group(signatures).apply_async().results]

        return send_many


class Floor(System):
    """Not Receipt: the least work any design keeping its contract must do (bench/floor.py); with
    ``reads``, the spec's reads too. Run on request, to check a ratio target against what is
    reachable at all on this machine."""

    def __init__(self, name: str, label: str, *, reads: bool, batched: bool = False) -> None:
        self.name = self.kind = name
        self.label = label
        self.reads = reads
        self.batched = batched
        # A floor does less than any design keeping the contract; a target it misses is out of
        # reach for Receipt too, on this machine and under the contract's own constraints.
        self.targets = (
            Target(f"{name} >= 1.0x Procrastinate", "procrastinate", 1.0),
            Target(f"{name} >= 1.5x Celery", "celery", 1.5),
        )

    def start(
        self, stack: ExitStack, harness: Harness, home: Path, db: Database, *, prepared: bool
    ) -> Deployment:
        from app.storage.migrate import upgrade
        from bench import floor

        upgrade(db.engine)  # the real receipts table, its constraints and its append-only triggers
        with db.engine.begin() as conn:
            conn.exec_driver_sql(floor.SCHEMA)
        stack.callback(harness.stop_all)
        redis = RedisServer(harness)
        redis.start()
        assert redis.proc is not None
        env = {
            "BENCH_FLOOR_BROKER": redis.url,
            "BENCH_FLOOR_DSN": sa_to_libpq(db.url),
            "BENCH_FLOOR_READS": "1" if self.reads else "0",
        }
        worker = harness.start(
            "floor",
            [PYTHON, "-m", "celery", "-A", "bench.floor:app", "worker", "--pool", "threads",
             "--concurrency", "8", "--queues", floor.QUEUE, "--without-gossip", "--without-mingle",
             "--loglevel", "WARNING"],
            child_env(**env),
        )  # fmt: skip
        return Deployment.on(
            self,
            db,
            {"worker": _pids(worker.pid), "redis": _pids(redis.proc.pid), "postgres": db.postgres},
            {**env, "BENCH_DB": db.url},
        )

    def done_count(self, conn: Connection, prefix: str, result: dict[str, Any]) -> int:
        return int(
            conn.execute(
                text("SELECT count(*) FROM floor_jobs WHERE status = 'completed' AND id LIKE :p"),
                {"p": f"{prefix}%"},
            ).scalar_one()
        )

    def timings(
        self, dep: Deployment, conn: Connection, prefix: str, result: dict[str, Any]
    ) -> tuple[list[float], float]:
        return _receipts_timings(dep, conn, prefix)

    def sender(self, engine: Engine, prefix: str) -> Sender:
        from bench import floor

        def done(k: str) -> bool:
            return bool(scalar(engine, "SELECT status FROM floor_jobs WHERE id = :k", k) == "completed")

        return floor.sender(self.batched), done


RECEIPT_PYTHON = ReceiptPython()
# Every system, in the order the targets and the statement count list them; the first
# four run by default, the floors on request (``--systems floor,floor-reads,floor-batched,celery``).
SYSTEMS: tuple[System, ...] = (
    RECEIPT_PYTHON,
    ReceiptHttp(),
    Procrastinate(),
    Celery(),
    Floor("floor", "Floor (bench/floor.py)", reads=False),
    Floor("floor-reads", "Floor with its reads", reads=True),
    Floor("floor-batched", "Floor, batched messages + commits", reads=False, batched=True),
)
DEFAULT_SYSTEMS = ("receipt-python", "receipt-http", "procrastinate", "celery")
BY_NAME = {system.name: system for system in SYSTEMS}
