"""The process harness: start processes by argv (never a shell), stop exactly those, by PID.

Each process runs in its own session with its output in a log file. At teardown the harness
sends SIGTERM to each process group it started, waits a bounded time, then SIGKILLs the group.
Used by the end-to-end tests, the packaging test, the benchmarks and the soak.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from devharness.waiting import wait_for

REPO_ROOT = Path(__file__).resolve().parents[1]
_VENV_PY = REPO_ROOT / ".venv" / "bin" / "python"
PYTHON = str(_VENV_PY) if _VENV_PY.exists() else sys.executable

STOP_GRACE_S = 8.0

# Variables of the developer's shell that must never leak into a process (or test) under test.
ISOLATED_PREFIXES = (
    "RECEIPT_",
    "RESONATE_",
    "JOB_LEASE_MS",
    "CODEX_JOB_LEASE_MS",
    "FACTORY_CONTROL_JOB_",
    "OTEL_",  # tracing (app/tracing.py): a test turns it on itself
)
ISOLATED_NAMES = ("DATABASE_URL", "REDIS_URL", "PORT", "WEB_CONCURRENCY")
# The test suite's own knobs (service URLs) pass through.
TEST_PREFIX = "RECEIPT_TEST_"


def is_isolated(name: str) -> bool:
    """True for a variable Receipt reads that a test must set itself, never inherit."""
    if name.startswith(TEST_PREFIX):
        return False
    return name.startswith(ISOLATED_PREFIXES) or name in ISOLATED_NAMES


def base_env(*, handlers: str = "devharness.handlers", **extra: str) -> dict[str, str]:
    """The environment of a process under test: the shell's, minus Receipt's own variables."""
    # Bytecode is written and reused, whatever the shell says: a process compiling the modules
    # only the processes under test import (tasks/, api/, workers/) would pay it on every start.
    env = {k: v for k, v in os.environ.items() if not is_isolated(k) and k != "PYTHONDONTWRITEBYTECODE"}
    env.update(
        {
            "PYTHONPATH": str(REPO_ROOT),
            "PYTHONUNBUFFERED": "1",
            "RECEIPT_HANDLER_MODULES": handlers,
            "RECEIPT_CODEX_COMMANDS": "enabled",
            # The tests read beat's sends, Celery's per-task lines and the loops' passes in the logs,
            # and a failing test's report shows the requests the web answered.
            "RECEIPT_LOG_TICKS": "enabled",
            "RECEIPT_ACCESS_LOG": "enabled",
        }
    )
    env.update(extra)
    return env


@dataclass
class Proc:
    """One process a harness started."""

    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    _log_file: IO[bytes] | None = field(repr=False, default=None)
    service: bool = False  # a backing service (redis-server): stopped after the processes using it
    stopped: bool = False  # stopped on purpose by the harness (not a crash)

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


class Harness:
    """Starts processes and, at teardown, stops exactly the ones it started."""

    def __init__(self, log_dir: Path, *, grace: float = STOP_GRACE_S, kill_at_end: bool = False) -> None:
        self.log_dir = log_dir
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.grace = grace
        # A test's teardown asserts nothing about how its processes stop (the graceful stop has
        # tests of its own), so it may kill them at once instead of paying each one's drain.
        self.kill_at_end = kill_at_end
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
        proc.stopped = True
        self.signal(proc, signal.SIGKILL)
        proc.popen.wait(timeout=10)
        self._close(proc)

    def stop(self, proc: Proc, grace: float | None = None) -> None:
        """SIGTERM, a bounded wait, then SIGKILL of the group."""
        proc.stopped = True
        if proc.alive():
            self.signal(proc, signal.SIGCONT)  # a SIGSTOPped process cannot act on SIGTERM
            self.signal(proc, signal.SIGTERM)
            try:
                proc.popen.wait(timeout=self.grace if grace is None else grace)
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
        """Stop every process (all at once, bounded), then the services they used; with
        ``kill_at_end``, SIGKILL them and every descendant instead."""
        if self.kill_at_end:
            self.kill_all()
            return
        for group in in_stop_order(self.procs):
            for proc in reversed(group):
                if proc.alive():
                    self.signal(proc, signal.SIGCONT)
                    self.signal(proc, signal.SIGTERM)
            deadline = time.monotonic() + self.grace
            for proc in reversed(group):
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
                self.stop(proc, grace=0.1)
        for pid in self.adopted:
            if pid_alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def kill_all(self) -> None:
        """SIGKILL every process's group and every descendant (a supervisor's children run in
        sessions of their own), the services last, and reap them."""
        # A process already stopped and reaped is left alone: its group id may belong to another now.
        live = [p for p in self.procs if p._log_file is not None or p.alive()]
        for group in in_stop_order(live):
            found = [pid for proc in group if proc.alive() for pid in descendants_of(proc.pid)]
            for proc in group:
                proc.stopped = True
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
            for pid in found + [pid for pid in self.adopted if pid_alive(pid)]:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            for proc in group:
                proc.popen.wait(timeout=10)
                self._close(proc)

    def check_alive(self) -> None:
        """Raise if a process started here has exited (a wait would otherwise run to its deadline)."""
        for proc in self.procs:
            if not proc.stopped and not proc.alive():
                raise RuntimeError(
                    f"{proc.name} (pid {proc.pid}) exited with {proc.popen.returncode}:\n{proc.tail(40)}"
                )

    def tails(self, lines: int = 60) -> str:
        out = []
        for proc in self.procs:
            state = "running" if proc.alive() else f"exited {proc.popen.returncode}"
            out.append(
                f"----- {proc.name} (pid {proc.pid}, {state}) {proc.log_path} -----\n{proc.tail(lines)}"
            )
        return "\n".join(out)


def in_stop_order(procs: list[Proc]) -> tuple[list[Proc], list[Proc]]:
    """The processes, then the services they use (a redis-server): stopped or killed in that order."""
    return [p for p in procs if not p.service], [p for p in procs if p.service]


# Harnesses in use, so a failing test's report can carry the tail of every log.
ACTIVE: list[Harness] = []


@contextlib.contextmanager
def harness_at(log_dir: Path, *, grace: float = STOP_GRACE_S, kill_at_end: bool = False) -> Iterator[Harness]:
    h = Harness(log_dir, grace=grace, kill_at_end=kill_at_end)
    ACTIVE.append(h)
    try:
        yield h
    finally:
        h.stop_all()
        ACTIVE.remove(h)


def active_log_tails() -> str:
    """The tail of every log of every harness in use ("" when none is)."""
    return "\n".join(h.tails() for h in ACTIVE)


# A line worth showing from anywhere in a log when a test fails: a tail alone loses the warning
# that explains the failure (a 503's "storage unavailable: ..." scrolled off by later requests).
NOTABLE = (" WARNING ", " ERROR ", " CRITICAL ", "FATAL:", "Traceback")


def active_notable_lines(limit: int = 40) -> str:
    """The last ``limit`` warning and error lines of every log of every harness in use, each
    prefixed with its process's name ("" when there are none)."""
    found = [
        f"{proc.name}: {line}"
        for h in ACTIVE
        for proc in h.procs
        for line in proc.log().splitlines()
        if any(mark in line for mark in NOTABLE)
    ]
    return "\n".join(found[-limit:])


def wait_started(proc: Proc, marker: str, timeout: float) -> None:
    """Wait until ``marker`` appears in the process's log; fail with its log if it exits first."""
    # Reading a log is cheap: a short interval keeps a start from waiting on the poll.
    wait_for(
        lambda: marker in proc.log() or not proc.alive(),
        timeout,
        interval=0.05,
        what=f"{proc.name}: {marker!r}",
    )
    assert proc.alive(), f"{proc.name} exited during start:\n{proc.tail()}"


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
