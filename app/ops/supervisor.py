"""``receipt up``: the whole system on one machine, supervised from one terminal.

Starts the same processes as the Procfile — web (gunicorn), driver, the three worker groups and
beat — as child processes, each in its own session so that Ctrl-C reaches only this supervisor,
which then stops every child by PID (SIGTERM, then SIGKILL after a grace period). A child that
dies is restarted with a backoff; one that keeps dying stops the whole run. Output is prefixed
per process, like a Procfile runner. With no DATABASE_URL / REDIS_URL this is the embedded
default (SQLite file + a folder broker under RECEIPT_HOME); otherwise it is production wiring.

This module starts processes by command line only; it imports neither Flask nor Celery.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from app.config import Settings
from app.jobs.privilege import COMMANDS_SCOPE
from app.storage.db import make_engine
from app.storage.files import private_dir, write_private

STOP_GRACE_S = 15.0
READY_TIMEOUT_S = 60.0
MAX_RESTARTS = 5
RESTART_WINDOW_S = 60.0


@dataclass(frozen=True)
class ProcessSpec:
    """One supervised process: its name and argv (never a shell)."""

    name: str
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)


def process_specs(host: str, port: int, python: str = sys.executable) -> list[ProcessSpec]:
    """The processes of one machine — the Procfile's, minus Flower."""
    worker = (python, "-m", "tasks.worker", "--role")
    return [
        ProcessSpec(
            "web",
            (
                python,
                "-m",
                "gunicorn",
                "-c",
                "python:api.gunicorn_conf",
                "--bind",
                f"{host}:{port}",
                "api.wsgi:app",
            ),
            {"RECEIPT_PROCESS_ROLE": "api"},
        ),
        ProcessSpec("driver", (*worker, "driver"), {"RECEIPT_PROCESS_ROLE": "driver"}),
        ProcessSpec("chat", (*worker, "worker-chat"), {"RECEIPT_PROCESS_ROLE": "worker-chat"}),
        ProcessSpec("codex", (*worker, "worker-codex"), {"RECEIPT_PROCESS_ROLE": "worker-codex"}),
        ProcessSpec("control", (*worker, "worker-control"), {"RECEIPT_PROCESS_ROLE": "worker-control"}),
        ProcessSpec("beat", (python, "-m", "tasks.beat"), {}),
    ]


class _Child:
    def __init__(self, spec: ProcessSpec, base_env: Mapping[str, str], out_lock: threading.Lock) -> None:
        self.spec = spec
        self.base_env = base_env
        self.out_lock = out_lock
        self.proc: subprocess.Popen[bytes] | None = None
        self.restarts: list[float] = []

    def start(self) -> None:
        env = {**self.base_env, **self.spec.env}
        self.proc = subprocess.Popen(
            self.spec.argv,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        threading.Thread(target=self._pump, daemon=True, name=f"out-{self.spec.name}").start()

    def _pump(self) -> None:
        proc = self.proc
        assert proc is not None and proc.stdout is not None
        prefix = f"{self.spec.name:>8} | ".encode()
        for line in iter(proc.stdout.readline, b""):
            with self.out_lock:
                sys.stdout.buffer.write(prefix + line)
                sys.stdout.buffer.flush()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)


def _say(lock: threading.Lock, text: str) -> None:
    with lock:
        sys.stdout.write(text + "\n")
        sys.stdout.flush()


def _prepare(settings: Settings) -> str:
    """Migrate, and return a dev token (reused across runs while it stays valid)."""
    from app.storage import tokens
    from app.storage.migrate import upgrade

    private_dir(settings.home_path)
    engine = make_engine(settings.sqlalchemy_url)
    # Issue 8: the dev token may run commands only where the deployment runs them at all.
    scopes = (COMMANDS_SCOPE,) if settings.codex_commands_enabled else ()
    try:
        upgrade(engine)
        token_file = settings.home_path / "dev-token"
        if token_file.exists():
            secret = token_file.read_text().strip()
            with engine.connect() as conn:
                info = tokens.authenticate(conn, secret)
            if info is not None and info.scopes == scopes:
                return secret
            if info is not None:
                tokens.revoke(engine, info.id)  # RECEIPT_CODEX_COMMANDS changed: a token to match
        _info, secret = tokens.create(engine, "dev", scopes=scopes)
        write_private(token_file, secret + "\n")
        return secret
    finally:
        engine.dispose()


def _wait_ready(url: str, deadline: float) -> bool:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/healthz", timeout=1) as resp:
                if resp.status == 200:
                    return True
        except OSError:
            pass
        time.sleep(0.2)
    return False


def run_up(settings: Settings, *, port: int = 8080, host: str = "127.0.0.1") -> int:
    lock = threading.Lock()
    token = _prepare(settings)
    env = dict(os.environ)
    env.setdefault("RECEIPT_HOME", str(settings.home_path))
    env["PYTHONUNBUFFERED"] = "1"
    # Children must import this checkout's packages whatever the current directory is.
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    children = [_Child(spec, env, lock) for spec in process_specs(host, port)]
    stopping = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    database = "PostgreSQL" if settings.database_url else f"SQLite at {settings.sqlalchemy_url[10:]}"
    broker = "Redis" if settings.redis_url else f"folder broker under {settings.home_path / 'broker'}"
    mode = f"{database}, {broker}"
    _say(lock, f"receipt up: {mode}; home {settings.home_path}")
    for child in children:
        child.start()
    url = f"http://{host}:{port}"
    if _wait_ready(url, time.monotonic() + READY_TIMEOUT_S):
        _say(
            lock,
            "\n".join(
                [
                    "",
                    f"Receipt is up at {url}",
                    f"Dev token (organization 'dev'): {token}",
                    f"  export RECEIPT_TOKEN={token}",
                    f'  curl -s {url}/jobs -H "Authorization: Bearer $RECEIPT_TOKEN"',
                    "Press Ctrl-C to stop everything.",
                    "",
                ]
            ),
        )
    else:
        _say(lock, f"receipt up: web did not answer {url}/healthz within {READY_TIMEOUT_S:.0f} s")
    code = 0
    while not stopping.wait(0.5):
        for child in children:
            proc = child.proc
            if proc is None or proc.poll() is None:
                continue
            now = time.monotonic()
            child.restarts = [t for t in child.restarts if now - t < RESTART_WINDOW_S] + [now]
            if len(child.restarts) > MAX_RESTARTS:
                _say(lock, f"receipt up: {child.spec.name} keeps exiting (code {proc.returncode}); stopping")
                stopping.set()
                code = 1
                break
            _say(lock, f"receipt up: {child.spec.name} exited with {proc.returncode}; restarting")
            time.sleep(min(5.0, 0.5 * len(child.restarts)))
            child.start()
    _say(lock, "receipt up: stopping")
    for child in children:
        child.stop()
    deadline = time.monotonic() + STOP_GRACE_S
    for child in children:
        proc = child.proc
        if proc is None:
            continue
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _say(lock, f"receipt up: {child.spec.name} did not stop in time; killing it")
            proc.kill()
            proc.wait()
    _say(lock, "receipt up: stopped")
    return code
