"""``receipt up``: the whole system on one machine, supervised from one terminal.

Starts the same processes as the Procfile — web (gunicorn), driver, the three worker groups and
beat — as child processes, each in its own session so that Ctrl-C reaches only this supervisor,
which then stops every child by PID (SIGTERM, then SIGKILL after a grace period). A child that
dies is restarted with a backoff; one that keeps dying stops the whole run. With no DATABASE_URL /
REDIS_URL this is the embedded default (SQLite file + a folder broker under RECEIPT_HOME);
otherwise it is production wiring.

Quiet by default: the terminal gets a short banner (URL, dev token, roles, where the logs are)
and one line per lifecycle event; each child's output goes to ``$RECEIPT_HOME/logs/<role>.log``
(the previous run's file is kept as ``<role>.log.1``). ``--verbose`` also streams every line to
the terminal, prefixed with its role, like a Procfile runner; ``receipt logs`` reads the files.
All children share one Prometheus multiprocess folder, ``$RECEIPT_HOME/metrics``, emptied here
at start, so the web process's ``/metrics`` adds up the workers' counters too (docs/metrics.md).

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
from app.storage.db import engine_for
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
    def __init__(
        self,
        spec: ProcessSpec,
        base_env: Mapping[str, str],
        out_lock: threading.Lock,
        log_path: Path,
        *,
        verbose: bool = False,
    ) -> None:
        self.spec = spec
        self.base_env = base_env
        self.out_lock = out_lock
        self.log_path = log_path
        self.verbose = verbose
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
        self._pumping = threading.Thread(target=self._pump, daemon=True, name=f"out-{self.spec.name}")
        self._pumping.start()

    def _pump(self) -> None:
        proc = self.proc
        assert proc is not None and proc.stdout is not None
        prefix = f"{self.spec.name:>8} | ".encode()
        # Appending: a restarted child continues the same file. The pipe is closed at EOF, or each
        # restart would leak one.
        with proc.stdout, open(self.log_path, "ab") as log:
            for line in iter(proc.stdout.readline, b""):
                log.write(line)
                log.flush()
                if self.verbose:
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
    engine = engine_for(settings)
    # The dev token may run commands only where the deployment runs them at all.
    scopes = (COMMANDS_SCOPE,) if settings.codex_commands else ()
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


def log_dir(settings: Settings) -> Path:
    """Where ``receipt up`` writes each child's output: ``$RECEIPT_HOME/logs``."""
    return settings.home_path / "logs"


def _fresh_logs(settings: Settings, names: list[str]) -> dict[str, Path]:
    """One log file per role; the previous run's is kept once as ``<role>.log.1``."""
    folder = log_dir(settings)
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name in names:
        path = folder / f"{name}.log"
        if path.exists():
            path.replace(folder / f"{name}.log.1")
        path.touch()
        paths[name] = path
    return paths


def _fresh_metrics_dir(settings: Settings) -> Path:
    """The run's Prometheus multiprocess folder, emptied: stale files would resurrect old counts."""
    folder = settings.home_path / "metrics"
    if folder.exists():
        for item in folder.iterdir():
            if item.is_file() and item.suffix == ".db":
                item.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    return folder


# The first job to try: it runs as printed once RECEIPT_URL/RECEIPT_TOKEN are exported (the CLI fills
# authContext from the token), and a test runs it (tests/e2e/test_readme_commands.py).
TRY_COMMAND = (
    'receipt jobs enqueue codex --kind factory.task.run --payload \'{"command":["echo","hello"]}\' --follow'
)


def try_line(settings: Settings) -> str:
    """The banner's suggestion: a command job when this deployment runs commands, else how to turn
    them on (the dev token only gets the ``commands`` scope when they are on, so the job would be a
    403)."""
    if settings.codex_commands:
        return f"Try:  {TRY_COMMAND}"
    return "Try:  receipt jobs list   ·   to run commands: RECEIPT_CODEX_COMMANDS=enabled receipt up"


def banner(settings: Settings, url: str, token: str, roles: list[str], *, verbose: bool = False) -> list[str]:
    """The first screen of ``receipt up`` (a test keeps it within 15 lines)."""
    database = "PostgreSQL" if settings.database_url else "SQLite"
    broker = "Redis" if settings.redis_url else "folder broker"
    logs = log_dir(settings)
    return [
        f"Receipt is up at {url}  ({database}, {broker}; home {settings.home_path})",
        f"Dev token (organization 'dev'): {token}",
        f"  export RECEIPT_URL={url} RECEIPT_TOKEN={token}",
        f"Running: {', '.join(roles)}",
        f"Logs: {logs}/<role>.log"
        + ("  (streamed below)" if verbose else "  (receipt logs [ROLE] -f, or receipt up --verbose)"),
        try_line(settings),
        f"API:  {url}/openapi.json   metrics: {url}/metrics (system token)",
        "Press Ctrl-C to stop everything.",
    ]


def run_up(settings: Settings, *, port: int = 8080, host: str = "127.0.0.1", verbose: bool = False) -> int:
    lock = threading.Lock()
    token = _prepare(settings)
    env = dict(os.environ)
    env.setdefault("RECEIPT_HOME", str(settings.home_path))
    env["PYTHONUNBUFFERED"] = "1"
    env["PROMETHEUS_MULTIPROC_DIR"] = str(_fresh_metrics_dir(settings))
    # Children must import this checkout's packages whatever the current directory is.
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    specs = process_specs(host, port)
    paths = _fresh_logs(settings, [spec.name for spec in specs])
    children = [_Child(spec, env, lock, paths[spec.name], verbose=verbose) for spec in specs]
    stopping = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    _say(lock, f"receipt up: starting {len(children)} processes (home {settings.home_path})")
    for child in children:
        child.start()
    url = f"http://{host}:{port}"
    if _wait_ready(url, time.monotonic() + READY_TIMEOUT_S):
        _say(lock, "\n".join(banner(settings, url, token, [c.spec.name for c in children], verbose=verbose)))
    else:
        _say(
            lock,
            f"receipt up: web did not answer {url}/healthz within {READY_TIMEOUT_S:.0f} s "
            f"(see {paths['web']})",
        )
    code = 0
    while not stopping.wait(0.5):
        for child in children:
            proc = child.proc
            if proc is None or proc.poll() is None:
                continue
            now = time.monotonic()
            child.restarts = [t for t in child.restarts if now - t < RESTART_WINDOW_S] + [now]
            if len(child.restarts) > MAX_RESTARTS:
                _say(
                    lock,
                    f"receipt up: {child.spec.name} keeps exiting (code {proc.returncode}); stopping "
                    f"(see {child.log_path})",
                )
                stopping.set()
                code = 1
                break
            _say(
                lock,
                f"receipt up: {child.spec.name} exited with {proc.returncode}; restarting "
                f"(see {child.log_path})",
            )
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
