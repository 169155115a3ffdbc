"""One real deployment under test: gunicorn, driver, worker groups and beat on PostgreSQL and Redis.

``Stack`` is one deployment (database, broker, processes, tokens) plus helpers to post jobs over
HTTP and to read a job's receipts straight from the database for exact counting. Every stack gets
its own redis-server (``RedisServer``), so nothing else on the machine (another session's
fixtures flushing, its in-process workers consuming) can touch its broker.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests
from sqlalchemy import select, text
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.jobs.ids import KEY_SEPARATOR, qualify
from app.jobs.reducer import Job
from app.jobs.vocab import TERMINAL_STATUSES, job_stream
from app.ops.metrics import MULTIPROC_ENV
from app.storage import store, tokens
from app.storage.db import deliveries, make_engine
from app.storage.store import StoredReceipt
from devharness.processes import PYTHON, Harness, Proc, base_env, wait_started
from devharness.services import RedisServer, ServiceUnavailable
from devharness.waiting import free_port, wait_for

ORG = "e2e-org"
SYSTEM_ORG = "e2e-system"
TERMINAL_TYPES = ("job.completed", "job.failed", "job.canceled")
BOOT_TIMEOUT_S = 60.0

# Short timings so faults resolve in seconds (app/jobs/timing.py derives the rest):
# lease 6 s -> execution timeout 5 s, heartbeat every 2 s; driver timeout stays at its 120 s floor.
FAST_TIMINGS: dict[str, str] = {
    "JOB_LEASE_MS": "6000",
    "CODEX_JOB_LEASE_MS": "10000",
    "RECEIPT_LEASE_EXPIRY_INTERVAL_MS": "500",
    "RECEIPT_RESONATE_QUEUED_REDRIVE_INTERVAL_MS": "1000",
    "RECEIPT_RESONATE_QUEUED_REDRIVE_MIN_AGE_MS": "1000",
    "RECEIPT_RESONATE_QUEUED_REDRIVE_COOLDOWN_MS": "1000",
    "RECEIPT_RESONATE_QUEUED_REDRIVE_STARTUP_DELAY_MS": "500",
    # Retries back off 300 ms, then 600 ms; the due-retries pass looks four times a second.
    "RECEIPT_RETRY_BACKOFF_MS": "300",
    "RECEIPT_RETRY_SCAN_INTERVAL_MS": "250",
}

ROLE_PROCESS = {
    "driver": "driver",
    "worker-chat": "chat",
    "worker-codex": "codex",
    "worker-control": "control",
}


@dataclass
class Stack:
    """One deployment of Receipt under test, and the helpers tests use against it."""

    harness: Harness
    database_url: str
    redis_url: str
    home: Path
    engine: Engine
    env_overrides: dict[str, str] = field(default_factory=dict)
    web_port: int = 0
    token: str = ""
    system_token: str = ""
    procs: dict[str, Proc] = field(default_factory=dict)
    http: requests.Session = field(default_factory=requests.Session)
    redis_server: RedisServer | None = None
    # The e2e tests' short timings; a benchmark sets {} before starting processes: production's.
    timings: dict[str, str] = field(default_factory=lambda: dict(FAST_TIMINGS))
    # gunicorn's keep-alive in seconds (None: api/gunicorn_conf.py's). A graceful stop waits for
    # every connection's keep-alive to run out, even one its client closed, so a test's web stops
    # this long after its last request instead of production's 5 s.
    web_keep_alive_s: int | None = None

    # -- processes
    def env(self, **extra: str) -> dict[str, str]:
        """A process's environment: this stack's database, broker and home, its timings, overrides."""
        env = base_env(**self.timings)
        env.update(DATABASE_URL=self.database_url, REDIS_URL=self.redis_url, RECEIPT_HOME=str(self.home))
        env.update(self.env_overrides)
        env.update(extra)
        return env

    def _launch(
        self, name: str, argv: list[str], env: dict[str, str], ready: Callable[[Proc], None] | None
    ) -> Proc:
        proc = self.harness.start(name, argv, env)
        self.procs[name] = proc
        if ready is not None:
            ready(proc)
        return proc

    def start_web(self, name: str = "web", wait: bool = True, **extra_env: str) -> Proc:
        self.web_port = self.web_port or free_port()
        return self._launch(
            name,
            [
                PYTHON,
                "-m",
                "gunicorn",
                "-c",
                "python:api.gunicorn_conf",
                "--bind",
                f"127.0.0.1:{self.web_port}",
                *([] if self.web_keep_alive_s is None else ["--keep-alive", str(self.web_keep_alive_s)]),
                "api.wsgi:app",
            ],
            # One gevent worker unless told otherwise (bench/compare.py runs the default two). The
            # metrics folder a web makes for itself is under the stack's home, so a web killed
            # rather than stopped leaves nothing behind outside it.
            self.env(
                **{
                    "RECEIPT_PROCESS_ROLE": "api",
                    "WEB_CONCURRENCY": "1",
                    MULTIPROC_ENV: tempfile.mkdtemp(prefix=f"{name}-metrics-", dir=self.home),
                    **extra_env,
                }
            ),
            (lambda _proc: self.wait_web()) if wait else None,
        )

    def wait_web(self) -> None:
        wait_for(
            lambda: self.http.get(self.url("/healthz"), timeout=1).status_code == 200,
            BOOT_TIMEOUT_S,
            interval=0.05,
            what="web /healthz",
            ignore=(requests.RequestException,),
        )

    def start_worker(self, role: str, name: str | None = None, wait: bool = True, **extra_env: str) -> Proc:
        name = name or ROLE_PROCESS[role]
        argv = [PYTHON, "-m", "tasks.worker", "--role", role]
        env = self.env(RECEIPT_PROCESS_ROLE=role, **extra_env)
        return self._launch(name, argv, env, self.wait_worker if wait else None)

    def wait_worker(self, proc: Proc) -> None:
        wait_started(proc, " ready.", BOOT_TIMEOUT_S)

    def start_beat(self, name: str = "beat", wait: bool = True, **extra_env: str) -> Proc:
        # Each beat gets its own schedule file, so two beats never share (or lock) one.
        argv = [PYTHON, "-m", "tasks.beat", "--schedule", str(self.home / f"{name}-schedule")]
        return self._launch(name, argv, self.env(**extra_env), self.wait_beat if wait else None)

    def wait_beat(self, proc: Proc) -> None:
        wait_started(proc, "beat: Starting", BOOT_TIMEOUT_S)

    def start(self, *names: str) -> None:
        """Start the named processes together (web, driver, chat, codex, control, beat) and wait for all."""
        started: list[tuple[str, Proc]] = []
        role_of = {v: k for k, v in ROLE_PROCESS.items()}
        for name in names:
            if name == "web":
                started.append((name, self.start_web(wait=False)))
            elif name.startswith("beat"):
                started.append((name, self.start_beat(name, wait=False)))
            else:
                started.append((name, self.start_worker(role_of[name.split("-")[0]], name, wait=False)))
        for name, proc in started:
            if name == "web":
                self.wait_web()
            elif name.startswith("beat"):
                self.wait_beat(proc)
            else:
                self.wait_worker(proc)

    def stop(self, name: str) -> None:
        self.harness.stop(self.procs.pop(name))

    # -- HTTP
    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.web_port}{path}"

    def headers(self, system: bool = False) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.system_token if system else self.token}"}

    def post_job(
        self,
        agent_id: str,
        kind: str = "factory.run",
        *,
        system: bool = False,
        max_attempts: int | None = None,
        job_id: str | None = None,
        **payload: Any,
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"payload": {"kind": kind, **payload}}
        if kind != "factory.objective.watchdog":
            body["payload"]["authContext"] = {"userId": "e2e-user", "organizationId": ORG}
        if max_attempts is not None:
            body["maxAttempts"] = max_attempts
        if job_id is not None:
            body["jobId"] = job_id
        r = self.http.post(
            self.url(f"/agents/{agent_id}/jobs"), json=body, headers=self.headers(system), timeout=15
        )
        assert r.status_code == 202, f"enqueue answered {r.status_code}: {r.text}"
        data: dict[str, Any] = r.json()
        job: dict[str, Any] = data["job"]
        assert data["async"]["jobId"] == job["id"]
        return job

    def get_job(
        self, job_id: str, system: bool = False, organization_id: str | None = None
    ) -> dict[str, Any]:
        """``GET /jobs/<jobId>``; a system token names another organisation with ``organization_id``."""
        params = {"organizationId": organization_id} if organization_id is not None else None
        r = self.http.get(
            self.url(f"/jobs/{job_id}"), params=params, headers=self.headers(system), timeout=10
        )
        assert r.status_code == 200, f"GET /jobs/{job_id} answered {r.status_code}: {r.text}"
        job: dict[str, Any] = r.json()["job"]
        return job

    def command(
        self, job_id: str, type_: str, payload: Any = None, reason: str | None = None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"type": type_}
        if payload is not None:
            body["payload"] = payload
        if reason is not None:
            body["reason"] = reason
        r = self.http.post(
            self.url(f"/jobs/{job_id}/commands"), json=body, headers=self.headers(), timeout=10
        )
        assert r.status_code == 202, f"command answered {r.status_code}: {r.text}"
        job: dict[str, Any] = r.json()["job"]
        return job

    def cancel(self, job_id: str, reason: str | None = None) -> dict[str, Any]:
        r = self.http.post(
            self.url(f"/jobs/{job_id}/cancel"),
            json={"reason": reason} if reason else {},
            headers=self.headers(),
            timeout=10,
        )
        assert r.status_code == 202, f"cancel answered {r.status_code}: {r.text}"
        job: dict[str, Any] = r.json()["job"]
        return job

    # -- the database, read directly (exact counting)
    def key(self, job_id: str, organization_id: str = ORG) -> str:
        """The storage key of a job: a client id (what the API answers carry) is the stack's
        organisation's unless another is named; a key (it holds the organisation) stays as it is."""
        return job_id if KEY_SEPARATOR in job_id else qualify(organization_id, job_id)

    def job(self, job_id: str) -> Job | None:
        return queue_for(self.engine).get(self.key(job_id))

    def status(self, job_id: str) -> str | None:
        job = self.job(job_id)
        return job.status if job else None

    def receipts(self, job_id: str) -> list[StoredReceipt]:
        with self.engine.connect() as conn:
            return store.read_stream(conn, job_stream(self.key(job_id)))

    def types(self, job_id: str) -> list[str]:
        return [r.type for r in self.receipts(job_id)]

    def deliveries(self, job_id: str) -> list[Any]:
        with self.engine.connect() as conn:
            return list(
                conn.execute(
                    select(deliveries)
                    .where(deliveries.c.job_id == self.key(job_id))
                    .order_by(deliveries.c.created_at)
                ).all()
            )

    def wait_status(self, job_id: str, *statuses: str, timeout: float = 30) -> Job:
        def check() -> Job | None:
            job = self.job(job_id)
            return job if job is not None and job.status in statuses else None

        return wait_for(
            check,
            timeout,
            what=f"job {job_id} to be {'/'.join(statuses)} "
            f"(now {self.status(job_id)}, receipts {self.types(job_id)})",
        )

    def wait_terminal(self, job_id: str, timeout: float = 30) -> Job:
        return self.wait_status(job_id, *TERMINAL_STATUSES, timeout=timeout)

    def wait_running(self, job_id: str, attempt: int = 1, timeout: float = 30) -> Job:
        def check() -> Job | None:
            job = self.job(job_id)
            return job if job is not None and job.status == "running" and job.attempt == attempt else None

        return wait_for(
            check, timeout, what=f"job {job_id} running attempt {attempt} (receipts {self.types(job_id)})"
        )

    def close(self) -> None:
        self.http.close()
        self.engine.dispose()


def key_of(job: Mapping[str, Any]) -> str:
    """The storage key of a job as the API answered it (its stream names the key)."""
    key: str = job["stream"].removeprefix("jobs/")
    return key


def terminal_receipts(receipts: list[StoredReceipt]) -> list[StoredReceipt]:
    return [r for r in receipts if r.type in TERMINAL_TYPES]


def worker_pid(worker_id: str) -> int:
    """The PID inside a lease holder id ``<hostname>:<pid>:<nonce>``."""
    match = re.fullmatch(r".*:(\d+):[0-9a-f]+", worker_id)
    assert match, f"unexpected worker id {worker_id!r}"
    return int(match.group(1))


# Settings for every process of every stack of a run, e.g. the fault tests once with batched
# deliveries: RECEIPT_TEST_STACK_ENV="RECEIPT_DELIVERY_BATCH_MAX=8" (Receipt's own variables are
# never inherited from the shell; a test's own overrides still win).
STACK_ENV = "RECEIPT_TEST_STACK_ENV"


def stack_env_from(environ: Mapping[str, str]) -> dict[str, str]:
    """``NAME=VALUE`` pairs, comma-separated, from ``RECEIPT_TEST_STACK_ENV``."""
    pairs: dict[str, str] = {}
    for item in (environ.get(STACK_ENV) or "").split(","):
        name, sep, value = item.strip().partition("=")
        if not item.strip():
            continue
        if not sep or not name.strip():
            raise ValueError(f"{STACK_ENV}: expected NAME=VALUE pairs, got {item.strip()!r}")
        pairs[name.strip()] = value.strip()
    return pairs


def make_stack(harness: Harness, database_url: str, home: Path, **env_overrides: str) -> Stack:
    """A deployment on ``database_url`` with its own redis-server (nothing else on the machine can
    consume, flush or restart its broker), and two API tokens (an organisation's and a system one)."""
    if not RedisServer.installed():
        raise ServiceUnavailable("redis-server is not on PATH")
    server = RedisServer(harness)
    server.start()
    engine = make_engine(database_url)
    # The organisation's token may post command jobs: the codex tests run one.
    _info, secret = tokens.create(engine, ORG, scopes=["commands"])
    _sys, system_secret = tokens.create(engine, SYSTEM_ORG, system=True)
    home.mkdir(parents=True, exist_ok=True)
    return Stack(
        harness,
        database_url,
        server.url,
        home,
        engine,
        {**stack_env_from(os.environ), **env_overrides},
        token=secret,
        system_token=system_secret,
        redis_server=server,
    )


def terminate_backends(admin: Engine, database_url: str) -> int:
    """``pg_terminate_backend`` every connection to the test database (not the machine's Postgres)."""
    database = database_url.rsplit("/", 1)[1]
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        rows = conn.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = :db AND pid "
                "<> pg_backend_pid()"
            ),
            {"db": database},
        ).all()
    return len(rows)
