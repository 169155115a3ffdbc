"""End-to-end harness: real gunicorn, celery workers and beat on real PostgreSQL and Redis.

- ``Harness`` starts processes (argv lists, never a shell) each in its own session with its
  output in a log file, records their PIDs, and at teardown stops only those PIDs: SIGTERM to
  the process group it started, a bounded wait, then SIGKILL of that group. A failing test gets
  the tail of every log attached to its report.
- ``wait_for`` polls a condition against a deadline: the only way these tests synchronise.
- ``Stack`` is one deployment (database, broker, processes, tokens) plus helpers to post jobs
  over HTTP and to read a job's receipts straight from the database for exact counting.
- ``RedisServer``: every deployment gets its own redis-server, so nothing else on the machine
  (another test session's fixtures flushing, its in-process workers consuming) can touch its
  broker, and the Redis-restart test can kill and restart it by PID.
- ``TcpProxy`` sits in front of PostgreSQL so a test can cut every connection for a while.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest
import requests
from sqlalchemy import select, text
from sqlalchemy.engine import Engine

from app.jobs.reducer import Job
from app.jobs.vocab import TERMINAL_STATUSES, job_stream
from app.storage import store, tokens
from app.storage.db import deliveries, make_engine
from app.storage.queue import Queue
from app.storage.store import StoredReceipt
from tests.conftest import _unavailable, cloned_database

REPO_ROOT = Path(__file__).resolve().parents[2]
_VENV_PY = REPO_ROOT / ".venv" / "bin" / "python"
PYTHON = str(_VENV_PY) if _VENV_PY.exists() else sys.executable

ORG = "e2e-org"
SYSTEM_ORG = "e2e-system"
TERMINAL_TYPES = ("job.completed", "job.failed", "job.canceled")

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
# Variables of the developer's shell that must never leak into a process under test.
_ISOLATED_PREFIXES = ("RECEIPT_", "RESONATE_", "JOB_LEASE_MS", "CODEX_JOB_LEASE_MS", "FACTORY_CONTROL_JOB_")
_ISOLATED_NAMES = ("DATABASE_URL", "REDIS_URL", "PORT", "WEB_CONCURRENCY")

BOOT_TIMEOUT_S = 60.0
STOP_GRACE_S = 8.0

T = TypeVar("T")


# -- waiting ---------------------------------------------------------------------------------------


def wait_for(
    condition: Callable[[], T],
    timeout: float,
    *,
    interval: float = 0.1,
    what: str = "condition",
    ignore: tuple[type[BaseException], ...] = (),
) -> T:
    """Poll ``condition`` until it returns something truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = condition()
        except ignore as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:.1f} s waiting for {what}; last value: {last!r}")
        time.sleep(interval)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def base_env(**extra: str) -> dict[str, str]:
    """The environment of a process under test: the shell's, minus Receipt's own variables."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not (k.startswith(_ISOLATED_PREFIXES) or k in _ISOLATED_NAMES) or k.startswith("RECEIPT_TEST_")
    }
    env.update(
        {
            "PYTHONPATH": str(REPO_ROOT),
            "PYTHONUNBUFFERED": "1",
            "PYTHONDONTWRITEBYTECODE": "1",
            "RECEIPT_HANDLER_MODULES": "tests.e2e.handlers",
            "RECEIPT_CODEX_COMMANDS": "enabled",
        }
    )
    env.update(extra)
    return env


# -- processes -------------------------------------------------------------------------------------


@dataclass
class Proc:
    """One process this harness started."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    _log_file: Any = field(repr=False, default=None)
    service: bool = False  # a backing service (redis-server): stopped after the processes using it

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def log_count(self, needle: str) -> int:
        return self.log().count(needle)

    def lines_with(self, needle: str) -> list[str]:
        return [line for line in self.log().splitlines() if needle in line]

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-lines:])


_ACTIVE: list[Harness] = []


class Harness:
    """Starts processes and, at teardown, stops exactly the ones it started."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.procs: list[Proc] = []
        self.adopted: list[int] = []  # descendants found later (e.g. `receipt up`'s children)
        self._counts: dict[str, int] = {}

    def start(
        self,
        name: str,
        argv: list[str],
        env: Mapping[str, str],
        *,
        cwd: Path | None = None,
        service: bool = False,
    ) -> Proc:
        n = self._counts.get(name, 0) + 1
        self._counts[name] = n
        log_path = self.log_dir / f"{name}-{n}.log"
        log_file = open(log_path, "wb")  # noqa: SIM115 - closed by stop()
        popen = subprocess.Popen(
            argv,
            env=dict(env),
            cwd=str(cwd or REPO_ROOT),
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        proc = Proc(name if n == 1 else f"{name}-{n}", popen, log_path, log_file, service)
        self.procs.append(proc)
        return proc

    def signal(self, proc: Proc, sig: int) -> None:
        """Send ``sig`` to the process group this harness started for ``proc`` (never anything else)."""
        if proc.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)

    def kill(self, proc: Proc) -> None:
        """SIGKILL the process group and reap it."""
        self.signal(proc, signal.SIGKILL)
        proc.popen.wait(timeout=10)
        self._close(proc)

    def stop(self, proc: Proc, grace: float = STOP_GRACE_S) -> None:
        """SIGTERM, a bounded wait, then SIGKILL of the group."""
        if proc.alive():
            self.signal(proc, signal.SIGCONT)  # a SIGSTOPped process cannot act on SIGTERM
            self.signal(proc, signal.SIGTERM)
            try:
                proc.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.signal(proc, signal.SIGKILL)
                proc.popen.wait(timeout=10)
        # The leader may be gone while others of its group live on: finish the group.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        self._close(proc)

    @staticmethod
    def _close(proc: Proc) -> None:
        if proc._log_file is not None:
            proc._log_file.close()
            proc._log_file = None

    def stop_all(self) -> None:
        """Stop every process (all at once, bounded), then the services they used."""
        for group in ([p for p in self.procs if not p.service], [p for p in self.procs if p.service]):
            for proc in reversed(group):
                if proc.alive():
                    self.signal(proc, signal.SIGCONT)
                    self.signal(proc, signal.SIGTERM)
            deadline = time.monotonic() + STOP_GRACE_S
            for proc in reversed(group):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
                self.stop(proc, grace=0.1)
        for pid in self.adopted:
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def tails(self, lines: int = 60) -> str:
        out = []
        for proc in self.procs:
            state = "running" if proc.alive() else f"exited {proc.popen.returncode}"
            out.append(
                f"----- {proc.name} (pid {proc.pid}, {state}) {proc.log_path} -----\n{proc.tail(lines)}"
            )
        return "\n".join(out)


@contextlib.contextmanager
def harness_at(log_dir: Path) -> Iterator[Harness]:
    h = Harness(log_dir)
    _ACTIVE.append(h)
    try:
        yield h
    finally:
        h.stop_all()
        _ACTIVE.remove(h)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and report.when in ("setup", "call") and _ACTIVE:
        report.sections.append(("e2e process logs (tail)", "\n".join(h.tails() for h in _ACTIVE)))


def pid_alive(pid: int) -> bool:
    """True if ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` (from /proc/<pid>/task/*/children)."""
    out: list[int] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            out.extend(int(c) for c in (task / "children").read_text().split())
    return out


def descendants_of(pid: int) -> list[int]:
    found: list[int] = []
    frontier = [pid]
    while frontier:
        nxt = []
        for p in frontier:
            kids = children_of(p)
            found.extend(kids)
            nxt.extend(kids)
        frontier = nxt
    return found


# -- services --------------------------------------------------------------------------------------


class RedisServer:
    """A private redis-server on a fixed port, killable and restartable by PID."""

    def __init__(self, harness: Harness, port: int | None = None) -> None:
        if shutil.which("redis-server") is None:
            _unavailable("redis-server", FileNotFoundError("redis-server is not on PATH"))
        self.harness = harness
        self.port = port or free_port()
        self.proc: Proc | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = self.harness.start(
            "redis",
            [
                "redis-server",
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
            ],
            env=base_env(),
            service=True,
        )
        wait_for(self.ping, 10, what=f"redis-server on port {self.port}")

    def ping(self) -> bool:
        import redis

        client = redis.Redis.from_url(self.url, socket_timeout=0.5, socket_connect_timeout=0.5)
        try:
            return bool(client.ping())
        except redis.RedisError:
            return False
        finally:
            client.close()

    def kill(self) -> None:
        assert self.proc is not None
        self.harness.kill(self.proc)


class TcpProxy:
    """A threaded TCP forwarder that can be cut: drop every live connection and refuse new ones."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(256)
        self._listener.settimeout(0.2)
        self.port = int(self._listener.getsockname()[1])
        self._lock = threading.Lock()
        self._pairs: set[tuple[socket.socket, socket.socket]] = set()
        self._cut = False
        self._closed = False
        self.refused = 0
        self.accepted = 0
        self._thread = threading.Thread(target=self._accept_loop, name="pg-proxy", daemon=True)
        self._thread.start()

    def _accept_loop(self) -> None:
        while not self._closed:
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            with self._lock:
                if self._cut or self._closed:
                    self.refused += 1
                    _close_quietly(client)
                    continue
            try:
                upstream = socket.create_connection(self.target, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _close_quietly(client)
                continue
            pair = (client, upstream)
            with self._lock:
                self._pairs.add(pair)
                self.accepted += 1
            threading.Thread(target=self._pump, args=(client, upstream, pair), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, pair), daemon=True).start()

    def _pump(
        self, src: socket.socket, dst: socket.socket, pair: tuple[socket.socket, socket.socket]
    ) -> None:
        try:
            while True:
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            self._drop(pair)

    def _drop(self, pair: tuple[socket.socket, socket.socket]) -> None:
        with self._lock:
            self._pairs.discard(pair)
        for s in pair:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            _close_quietly(s)

    @property
    def live_connections(self) -> int:
        with self._lock:
            return len(self._pairs)

    def cut(self) -> None:
        """Close every current connection and refuse new ones until ``restore``."""
        with self._lock:
            self._cut = True
            pairs = list(self._pairs)
        for pair in pairs:
            self._drop(pair)

    def restore(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self._closed = True
        self.cut()
        _close_quietly(self._listener)
        self._thread.join(timeout=2)


def _close_quietly(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.close()


# -- one deployment --------------------------------------------------------------------------------

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

    # -- processes
    def env(self, **extra: str) -> dict[str, str]:
        """A process's environment: this stack's database, broker and home, short timings, overrides."""
        env = base_env(**FAST_TIMINGS)
        env.update(DATABASE_URL=self.database_url, REDIS_URL=self.redis_url, RECEIPT_HOME=str(self.home))
        env.update(self.env_overrides)
        env.update(extra)
        return env

    def start_web(self, name: str = "web", wait: bool = True) -> Proc:
        self.web_port = self.web_port or free_port()
        proc = self.harness.start(
            name,
            [
                PYTHON,
                "-m",
                "gunicorn",
                "-c",
                "python:api.gunicorn_conf",
                "--bind",
                f"127.0.0.1:{self.web_port}",
                "api.wsgi:app",
            ],
            self.env(RECEIPT_PROCESS_ROLE="api", WEB_CONCURRENCY="1"),
        )
        self.procs[name] = proc
        if wait:
            self.wait_web()
        return proc

    def wait_web(self) -> None:
        wait_for(
            lambda: self.http.get(self.url("/healthz"), timeout=1).status_code == 200,
            BOOT_TIMEOUT_S,
            what="web /healthz",
            ignore=(requests.RequestException,),
        )

    def start_worker(self, role: str, name: str | None = None, wait: bool = True, **extra_env: str) -> Proc:
        name = name or ROLE_PROCESS[role]
        proc = self.harness.start(
            name,
            [PYTHON, "-m", "tasks.worker", "--role", role],
            self.env(RECEIPT_PROCESS_ROLE=role, **extra_env),
        )
        self.procs[name] = proc
        if wait:
            self.wait_worker(proc)
        return proc

    def wait_worker(self, proc: Proc) -> None:
        wait_for(lambda: _ready_or_dead(proc, " ready."), BOOT_TIMEOUT_S, what=f"{proc.name} ready")
        assert proc.alive(), f"{proc.name} exited during start:\n{proc.tail()}"

    def start_beat(self, name: str = "beat", wait: bool = True, **extra_env: str) -> Proc:
        # Each beat gets its own schedule file, so two beats never share (or lock) one.
        proc = self.harness.start(
            name,
            [PYTHON, "-m", "tasks.beat", "--schedule", str(self.home / f"{name}-schedule")],
            self.env(**extra_env),
        )
        self.procs[name] = proc
        if wait:
            self.wait_beat(proc)
        return proc

    def wait_beat(self, proc: Proc) -> None:
        wait_for(lambda: _ready_or_dead(proc, "beat: Starting"), BOOT_TIMEOUT_S, what=f"{proc.name} start")
        assert proc.alive(), f"{proc.name} exited during start:\n{proc.tail()}"

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
        assert data["async"]["jobId"] == data["job"]["id"]
        return data["job"]

    def get_job(self, job_id: str, system: bool = False) -> dict[str, Any]:
        r = self.http.get(self.url(f"/jobs/{job_id}"), headers=self.headers(system), timeout=10)
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
    def job(self, job_id: str) -> Job | None:
        return Queue(self.engine).get(job_id)

    def status(self, job_id: str) -> str | None:
        job = self.job(job_id)
        return job.status if job else None

    def receipts(self, job_id: str) -> list[StoredReceipt]:
        with self.engine.connect() as conn:
            return store.read_stream(conn, job_stream(job_id))

    def types(self, job_id: str) -> list[str]:
        return [r.type for r in self.receipts(job_id)]

    def deliveries(self, job_id: str) -> list[Any]:
        with self.engine.connect() as conn:
            return list(
                conn.execute(
                    select(deliveries).where(deliveries.c.job_id == job_id).order_by(deliveries.c.created_at)
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


def _ready_or_dead(proc: Proc, marker: str) -> bool:
    return marker in proc.log() or not proc.alive()


def terminal_receipts(receipts: list[StoredReceipt]) -> list[StoredReceipt]:
    return [r for r in receipts if r.type in TERMINAL_TYPES]


def worker_pid(worker_id: str) -> int:
    """The PID inside a lease holder id ``<hostname>:<pid>:<nonce>``."""
    match = re.fullmatch(r".*:(\d+):[0-9a-f]+", worker_id)
    assert match, f"unexpected worker id {worker_id!r}"
    return int(match.group(1))


def make_stack(harness: Harness, database_url: str, home: Path, **env_overrides: str) -> Stack:
    """A deployment on ``database_url`` with its own redis-server (nothing else on the machine can
    consume, flush or restart its broker), and two API tokens (an organisation's and a system one)."""
    server = RedisServer(harness)
    server.start()
    engine = make_engine(database_url)
    # The organisation's token may post command jobs (issue 8): the codex tests run one.
    _info, secret = tokens.create(engine, ORG, scopes=["commands"])
    _sys, system_secret = tokens.create(engine, SYSTEM_ORG, system=True)
    home.mkdir(parents=True, exist_ok=True)
    return Stack(
        harness,
        database_url,
        server.url,
        home,
        engine,
        dict(env_overrides),
        token=secret,
        system_token=system_secret,
        redis_server=server,
    )


# -- fixtures --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def module_database_url(pg_admin: Engine, pg_template: str) -> Iterator[str]:
    """A fresh migrated PostgreSQL database shared by one module's tests."""
    with cloned_database(pg_admin, pg_template, "receipt_e2e") as url:
        yield url


@pytest.fixture(scope="module")
def module_harness(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Harness]:
    with harness_at(tmp_path_factory.mktemp("e2e-logs")) as h:
        yield h


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    with harness_at(tmp_path / "logs") as h:
        yield h


@pytest.fixture(scope="module")
def module_stack(
    module_harness: Harness, module_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """web, driver, the three worker groups and beat, shared by the tests of one module."""
    stack = make_stack(module_harness, module_database_url, tmp_path_factory.mktemp("e2e-home"))
    try:
        stack.start("web", "driver", "chat", "codex", "control", "beat")
        yield stack
    finally:
        stack.close()  # first: an open keep-alive connection would hold gunicorn's graceful stop
        module_harness.stop_all()


@pytest.fixture
def stack(harness: Harness, pg_database_url: str, tmp_path: Path) -> Iterator[Stack]:
    """A dedicated deployment for one destructive test; the test starts the processes it needs."""
    s = make_stack(harness, pg_database_url, tmp_path / "home")
    try:
        yield s
    finally:
        s.close()
        harness.stop_all()


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
