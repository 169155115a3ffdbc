"""PostgreSQL and Redis for the tests, and the service doubles the end-to-end tests drive.

Where the services come from, per test process (``postgres_admin_url`` / ``redis_base_url``):

1. ``RECEIPT_TEST_PG_URL`` / ``RECEIPT_TEST_REDIS_URL`` when set: used as they are.
2. Otherwise the machine's service on 127.0.0.1:5432 / 127.0.0.1:6379, when it answers.
   (``RECEIPT_TEST_PG_PROBE`` / ``RECEIPT_TEST_REDIS_PROBE`` = ``host:port`` move the probe.)
3. Otherwise a private, throwaway instance on a free port, started with pytest-postgresql's
   and pytest-redis's executors from the installed server binaries (``pg_ctl`` on PATH or under
   /usr/lib/postgresql/*/bin; ``redis-server``) and removed, data directory and all, at the end
   of the session. ``RECEIPT_TEST_PRIVATE_SERVICES=always`` skips step 2, ``never`` skips step 3.

``RedisServer`` (a redis-server a test can kill and restart by PID) and ``TcpProxy`` (a cuttable
TCP forwarder in front of PostgreSQL) belong to the fault tests.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import socket
import stat
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol

from devharness.processes import Harness, Proc, base_env
from devharness.waiting import free_port, port_open, wait_for

PG_URL_VAR = "RECEIPT_TEST_PG_URL"
REDIS_URL_VAR = "RECEIPT_TEST_REDIS_URL"
PG_PROBE_VAR = "RECEIPT_TEST_PG_PROBE"
REDIS_PROBE_VAR = "RECEIPT_TEST_REDIS_PROBE"
PRIVATE_VAR = "RECEIPT_TEST_PRIVATE_SERVICES"  # auto (default) | always | never

PG_URL_TEMPLATE = "postgresql+psycopg2://postgres@{host}:{port}/postgres"
REDIS_URL_TEMPLATE = "redis://{host}:{port}"
START_TIMEOUT_S = 120


class ServiceUnavailable(RuntimeError):
    """A service the harness needs is not installed or not reachable (the tests skip on it)."""


def _probe(var: str, default: str) -> tuple[str, int]:
    host, _, port = os.environ.get(var, default).rpartition(":")
    return host or "127.0.0.1", int(port)


def _private_mode() -> str:
    mode = os.environ.get(PRIVATE_VAR, "auto")
    if mode not in ("auto", "always", "never"):
        raise ValueError(f"{PRIVATE_VAR} must be auto, always or never, not {mode!r}")
    return mode


def find_pg_ctl() -> str | None:
    """``pg_ctl`` on PATH, else the newest under /usr/lib/postgresql/*/bin (Debian keeps it there)."""
    found = shutil.which("pg_ctl")
    if found:
        return found
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(Path(p).parts[-3].split(".")[0])
    )
    return candidates[-1] if candidates else None


def _as_postgres_user(pg_ctl: str, workdir: Path) -> str:
    """A ``pg_ctl`` stand-in that drops root to the ``postgres`` user (initdb refuses to run as root).

    A small Python launcher, not a shell script: it sets the ids and execs the real ``pg_ctl``.
    """
    user = pwd.getpwnam("postgres")
    launcher = workdir / "pg_ctl"
    launcher.write_text(
        f"#!{sys.executable}\n"
        "import os, sys\n"
        f"os.setgid({user.pw_gid}); os.setuid({user.pw_uid})\n"
        f"os.execv({pg_ctl!r}, [{pg_ctl!r}, *sys.argv[1:]])\n"
    )
    launcher.chmod(launcher.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    os.chown(workdir, user.pw_uid, user.pw_gid)
    return str(launcher)


class _Executor(Protocol):
    def start(self) -> object: ...
    def stop(self) -> object: ...


@contextlib.contextmanager
def _throwaway(
    prefix: str,
    executor_for: Callable[[Path, int], _Executor],
    url: str,
    ready: Callable[[str], bool] | None = None,
) -> Iterator[str]:
    """Start a server in a new temporary folder on a free port; stop it and remove the folder on exit.

    ``ready(url)`` is polled until true when given: PostgreSQL opens its port while it still answers
    "the database system is starting up", so an open port is not yet a usable server.
    """
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        port = free_port()
        executor = executor_for(workdir, port)
        executor.start()
        try:
            address = url.format(host="127.0.0.1", port=port)
            if ready is not None:
                wait_for(
                    lambda: ready(address), START_TIMEOUT_S, what=f"{prefix} server to accept connections"
                )
            yield address
        finally:
            executor.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


def private_postgres() -> contextlib.AbstractContextManager[str]:
    """A throwaway PostgreSQL cluster on a free port (trust auth, user postgres); removed on exit."""
    from pytest_postgresql.executors import PostgreSQLExecutor

    pg_ctl = find_pg_ctl()
    if pg_ctl is None:
        raise FileNotFoundError("pg_ctl is not on PATH nor under /usr/lib/postgresql/*/bin")

    def executor_for(workdir: Path, port: int) -> _Executor:
        return PostgreSQLExecutor(
            executable=_as_postgres_user(pg_ctl, workdir) if os.geteuid() == 0 else pg_ctl,
            host="127.0.0.1",
            port=port,
            datadir=str(workdir / "data"),
            unixsocketdir=str(workdir),
            logfile=str(workdir / "postgresql.log"),
            startparams="-w",
            dbname="postgres",
            timeout=START_TIMEOUT_S,
            # A throwaway cluster needs no durability: faster commits for the tests.
            postgres_options="-c fsync=off -c full_page_writes=off -c synchronous_commit=off",
        )

    return _throwaway("receipt-pg-", executor_for, PG_URL_TEMPLATE, ready=_accepts_queries)


def _accepts_queries(url: str) -> bool:
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import OperationalError

    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
        return True
    except OperationalError:
        return False
    finally:
        engine.dispose()


def private_redis() -> contextlib.AbstractContextManager[str]:
    """A throwaway redis-server on a free port, no persistence; removed on exit."""
    from pytest_redis.executor import RedisExecutor

    redis_server = shutil.which("redis-server")
    if redis_server is None:
        raise FileNotFoundError("redis-server is not on PATH")

    def executor_for(workdir: Path, port: int) -> _Executor:
        return RedisExecutor(
            redis_server,
            databases=16,
            redis_timeout=30,
            loglevel="warning",
            host="127.0.0.1",
            port=port,
            startup_timeout=START_TIMEOUT_S,
            datadir=workdir,
        )

    return _throwaway("receipt-redis-", executor_for, REDIS_URL_TEMPLATE)


# The URLs this process resolved (a session resolves each once; helpers outside fixtures read them).
_resolved: dict[str, str] = {}


def resolved_pg_admin_url() -> str:
    """The PostgreSQL admin URL the session resolved (the configured/default one before that)."""
    return (
        _resolved.get("pg")
        or os.environ.get(PG_URL_VAR)
        or PG_URL_TEMPLATE.format(host="127.0.0.1", port=5432)
    )


@contextlib.contextmanager
def _remember(key: str, url: str) -> Iterator[str]:
    _resolved[key] = url
    try:
        yield url
    finally:
        _resolved.pop(key, None)


@contextlib.contextmanager
def postgres_admin_url() -> Iterator[str]:
    """The URL of a PostgreSQL maintenance database for this session (see the module docstring)."""
    configured = os.environ.get(PG_URL_VAR)
    host, port = _probe(PG_PROBE_VAR, "127.0.0.1:5432")
    mode = _private_mode()
    if configured or mode == "never" or (mode == "auto" and port_open(host, port)) or find_pg_ctl() is None:
        with _remember("pg", configured or PG_URL_TEMPLATE.format(host=host, port=port)) as url:
            yield url
        return
    with private_postgres() as private, _remember("pg", private) as url:
        yield url


@contextlib.contextmanager
def redis_base_url() -> Iterator[str]:
    """The URL (without a database number) of a Redis for this session (see the module docstring)."""
    configured = os.environ.get(REDIS_URL_VAR)
    if configured:
        yield configured
        return
    host, port = _probe(REDIS_PROBE_VAR, "127.0.0.1:6379")
    mode = _private_mode()
    if mode == "never" or (mode == "auto" and port_open(host, port)) or shutil.which("redis-server") is None:
        yield REDIS_URL_TEMPLATE.format(host=host, port=port)
        return
    with private_redis() as url:
        yield url


# -- doubles the fault tests drive -------------------------------------------------------------------


class RedisServer:
    """A private redis-server on a fixed port, killable and restartable by PID."""

    def __init__(self, harness: Harness, port: int | None = None, password: str | None = None) -> None:
        self.harness = harness
        self.port = port or free_port()
        self.password = password  # requirepass: every client must AUTH (its URL carries it)
        self.proc: Proc | None = None

    @staticmethod
    def installed() -> bool:
        return shutil.which("redis-server") is not None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        return f"redis://{auth}127.0.0.1:{self.port}/0"

    def start(self, data_dir: Path | None = None) -> None:
        """Start it; with ``data_dir`` it loads ``dump.rdb`` from there (a snapshot a ``SAVE`` wrote)."""
        argv = ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1"]
        argv += ["--save", "", "--appendonly", "no", "--daemonize", "no"]
        if data_dir is not None:
            argv += ["--dir", str(data_dir), "--dbfilename", "dump.rdb"]
        if self.password:
            argv += ["--requirepass", self.password]
        self.proc = self.harness.start("redis", argv, env=base_env(), service=True)
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
        self._flowing = threading.Event()  # cleared by ``hold``: connections stay open, nothing moves
        self._flowing.set()
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
                while not self._flowing.wait(0.2):
                    if self._closed:
                        return
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

    def hold(self) -> None:
        """Stall the database without closing anything: connections (old and new) stay open but no
        byte is forwarded until ``release``, so a client's next statement blocks -- a frozen or
        unreachable server, not a refused one."""
        self._flowing.clear()

    def release(self) -> None:
        self._flowing.set()

    def close(self) -> None:
        self._closed = True
        self._flowing.set()
        self.cut()
        _close_quietly(self._listener)
        self._thread.join(timeout=2)


def _close_quietly(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.close()
