"""Hostile commands against the sandbox, with real processes.

Each command is what a hostile tenant holding the ``commands`` scope would try. For each: the
attempt is contained (it settles with a clear outcome), the worker survives (this process goes
on to run the next command), and nothing of the command remains afterwards — checked by scanning
/proc for a marker every process of the command carries in its argv, and by the scratch
directory being gone. Limits are set small so every case is bounded in time.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.config import Settings
from app.jobs.reducer import Job
from app.storage.queue import Queue
from workers import sandbox
from workers.registry import default_registry
from workers.runner import run_attempt

from .runtime_support import enqueue, wait_until
from .test_codex import PY, marked


def _own_user(*candidates: str) -> str:
    """A system user nothing else runs commands as (test_codex.py and e2e use ``nobody``).

    RLIMIT_NPROC counts per user, and tests run in parallel (xdist): the fork bomb exhausts its
    user's budget on purpose, which must not starve another test's command meanwhile.
    """
    for name in candidates:
        try:
            pwd.getpwnam(name)
            return name
        except KeyError:
            continue
    return "nobody"


BASE = Settings.from_env(
    {
        "RECEIPT_CODEX_COMMANDS": "enabled",
        "RECEIPT_CODEX_USER": _own_user("games", "news"),
        "RECEIPT_CODEX_CPU_SECONDS": "20",
        "RECEIPT_CODEX_MAX_PROCESSES": "24",
        "RECEIPT_CODEX_MAX_FILE_MB": "8",
    }
)
HOST = sandbox.detect_host()
needs_namespaces = pytest.mark.skipif(
    not HOST.namespaces, reason="this host gives commands no PID/network namespace (logged at worker start)"
)


@pytest.fixture
def queue(sqlite_engine: Engine) -> Queue:
    return queue_for(sqlite_engine)


@pytest.fixture
def scratch_root() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="receipt-test-scratch-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def settings(scratch_root: Path) -> Settings:
    return replace(BASE, codex_scratch_root=str(scratch_root))


def hostile(script: str, marker: str) -> list[str]:
    """``python3 -c script marker``: the marker rides in argv, so every fork of it carries it too."""
    return [PY, "-c", textwrap.dedent(script), marker]


def run(queue: Queue, settings: Settings, argv: list[str], **payload: Any) -> Job:
    job = enqueue(queue, "codex", max_attempts=1, command=argv, **payload)
    out = run_attempt(queue, settings, default_registry(), job.id, 1)
    assert out.job is not None
    return out.job


def assert_contained(queue: Queue, settings: Settings, marker: str, scratch_root: Path) -> None:
    """Nothing of the command remains, its scratch directory is gone, and the worker still works."""
    assert marked(marker) == [], "a process of the command outlived its attempt"
    assert list(scratch_root.iterdir()) == [], "the attempt's scratch directory was not removed"
    after = run(queue, settings, ["echo", "still here"])
    assert (after.status, after.result["outputTail"]) == ("completed", "still here\n")


@needs_namespaces
def test_reading_the_workers_environ_through_proc_is_denied(
    queue: Queue, settings: Settings, scratch_root: Path
) -> None:
    marker = f"hostile-{uuid.uuid4().hex}"
    script = f"""
        import os
        for pid in (os.getppid(), {os.getpid()}, 1):
            try:
                with open(f"/proc/{{pid}}/environ", "rb") as f:
                    print(pid, "READ", len(f.read()))
            except OSError as exc:
                print(pid, "denied", type(exc).__name__)
        print("pids", sorted(int(p) for p in os.listdir("/proc") if p.isdigit()))
    """
    job = run(queue, settings, hostile(script, marker))
    out = job.result["outputTail"]
    assert job.status == "completed", job.error
    assert "READ" not in out, out
    assert out.count("denied") == 3
    # The command's /proc shows only its own namespace: init (1) and itself, nothing of the host.
    assert re.search(r"^pids \[1, \d+\]$", out, re.MULTILINE), out
    assert_contained(queue, settings, marker, scratch_root)


@needs_namespaces
def test_connecting_to_the_database_port_is_unreachable(
    queue: Queue, settings: Settings, scratch_root: Path
) -> None:
    marker = f"hostile-{uuid.uuid4().hex}"
    script = """
        import socket
        try:
            socket.create_connection(("127.0.0.1", 5432), timeout=3)
            print("CONNECTED")
        except OSError as exc:
            print("refused:", exc.errno, exc)
    """
    job = run(queue, settings, hostile(script, marker))
    assert job.status == "completed", job.error
    assert "CONNECTED" not in job.result["outputTail"]
    assert "Network is unreachable" in job.result["outputTail"]
    assert_contained(queue, settings, marker, scratch_root)


def test_a_fork_bomb_hits_the_process_limit_and_dies_with_its_attempt(
    queue: Queue, settings: Settings, scratch_root: Path
) -> None:
    marker = f"hostile-{uuid.uuid4().hex}"
    script = """
        import os, time
        refused = 0
        while True:
            try:
                os.fork()
            except OSError:
                refused += 1
                if refused == 50:
                    print("fork refused", flush=True)
                time.sleep(0.01)
    """
    # A user of its own: its budget is the one this test exhausts (see _own_user).
    bomb = replace(settings, codex_user=_own_user("man", "lp"))
    job = run(queue, bomb, hostile(script, marker), timeout=3000)
    assert job.status == "failed"
    assert job.result["status"] == "execution_timeout"
    assert "fork refused" in job.result["outputTail"]
    assert_contained(queue, settings, marker, scratch_root)


def test_allocating_4_gib_fails_inside_the_memory_limit(
    queue: Queue, settings: Settings, scratch_root: Path
) -> None:
    marker = f"hostile-{uuid.uuid4().hex}"
    job = run(queue, settings, hostile("bytearray(4 << 30)", marker))
    assert job.status == "failed"
    assert job.result["exitCode"] == 1
    assert "MemoryError" in job.result["outputTail"]
    assert_contained(queue, settings, marker, scratch_root)


def test_writing_2_gib_stops_at_the_file_size_limit(
    queue: Queue, settings: Settings, scratch_root: Path
) -> None:
    marker = f"hostile-{uuid.uuid4().hex}"
    script = """
        import os
        chunk = b"x" * (1 << 20)
        try:
            with open("big", "wb") as f:
                for _ in range(2048):
                    f.write(chunk)
        finally:
            print("size", os.path.getsize("big"), flush=True)
    """
    job = run(queue, settings, hostile(script, marker))
    assert job.status == "failed"
    out = job.result["outputTail"]
    assert "File too large" in out
    assert f"size {8 << 20}" in out  # RECEIPT_CODEX_MAX_FILE_MB=8, not a byte more
    assert_contained(queue, settings, marker, scratch_root)


@needs_namespaces
def test_a_daemon_started_with_setsid_and_a_double_fork_dies_with_its_attempt(
    queue: Queue, settings: Settings, scratch_root: Path
) -> None:
    marker = f"hostile-{uuid.uuid4().hex}"
    script = """
        import os, sys, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(120)  # the daemon
            os._exit(0)
        time.sleep(0.5)
        print("daemon started", flush=True)
    """
    job = run(queue, settings, hostile(script, marker))
    assert job.status == "completed", job.error
    assert "daemon started" in job.result["outputTail"]
    assert_contained(queue, settings, marker, scratch_root)


def test_a_command_ignoring_sigterm_is_killed_at_its_timeout(
    queue: Queue, settings: Settings, scratch_root: Path
) -> None:
    marker = f"hostile-{uuid.uuid4().hex}"
    script = """
        import signal, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("ignoring SIGTERM", flush=True)
        time.sleep(120)
    """
    job = run(queue, settings, hostile(script, marker), timeout=1500)
    assert job.status == "failed"
    assert job.result["status"] == "execution_timeout"
    assert "ignoring SIGTERM" in job.result["outputTail"]
    assert_contained(queue, settings, marker, scratch_root)


@pytest.mark.parametrize("cwd", ["../../etc", "/etc", "sub/../../.."])
def test_a_cwd_outside_the_scratch_directory_fails_non_retryably_naming_the_rule(
    queue: Queue, settings: Settings, scratch_root: Path, cwd: str
) -> None:
    marker = f"hostile-{uuid.uuid4().hex}"
    job = enqueue(queue, "codex", max_attempts=3, command=hostile("print('ran')", marker), cwd=cwd)
    out = run_attempt(queue, settings, default_registry(), job.id, 1)
    assert out.job is not None
    assert (out.job.status, out.job.attempt) == ("failed", 1)
    assert out.job.error.startswith("payload.cwd:")
    assert "scratch directory" in out.job.error
    assert_contained(queue, settings, marker, scratch_root)


def test_a_cwd_must_stay_inside_the_workspace_root(
    queue: Queue, settings: Settings, scratch_root: Path, tmp_path: Path
) -> None:
    workspace = tmp_path / "workspace"
    (workspace / "repo").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (workspace / "escape").symlink_to(tmp_path / "outside")
    with_root = replace(settings, codex_workspace_root=str(workspace))
    for cwd in ("../outside", "escape", str(tmp_path)):
        job = enqueue(queue, "codex", max_attempts=1, command=["true"], cwd=cwd)
        out = run_attempt(queue, with_root, default_registry(), job.id, 1)
        assert out.job is not None and out.job.status == "failed", cwd
        assert "RECEIPT_CODEX_WORKSPACE_ROOT" in out.job.error


# -- a worker killed mid-job takes its command with it -------------------------------------------

_WORKER = """
import sys
from app.config import Settings
from app.composition import queue_for
from app.storage.db import make_engine
from workers.registry import default_registry
from workers.runner import run_attempt
settings = Settings.from_env({"RECEIPT_CODEX_COMMANDS": "enabled"})
run_attempt(queue_for(make_engine(sys.argv[1])), settings, default_registry(), sys.argv[2], 1)
"""


def test_a_sigkilled_worker_takes_its_command_with_it(queue: Queue, sqlite_database_url: str) -> None:
    marker = f"hostile-{uuid.uuid4().hex}"
    script = """
        import os, time
        if os.fork() == 0:
            os.setsid()
            time.sleep(120)
        print("started", flush=True)
        time.sleep(120)
    """
    job = enqueue(queue, "codex", command=hostile(script, marker))
    worker = subprocess.Popen(
        [sys.executable, "-c", _WORKER, sqlite_database_url, job.id], cwd=Path(__file__).parents[2]
    )
    try:
        wait_until(lambda: len(marked(marker)) >= 2, timeout=30, what="the command and its child")
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(10)
        # The parent-death signal reaches the sandbox at once; the namespace dies with its init.
        wait_until(lambda: not marked(marker), timeout=10, what="the command to die with its worker")
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        for pid in marked(marker):
            os.kill(pid, signal.SIGKILL)


# -- what the host gives, said out loud -------------------------------------------------------------


def test_protections_off_names_what_a_host_cannot_give() -> None:
    config = sandbox.SandboxConfig.from_settings(BASE)
    assert sandbox.protections_off(config, sandbox.Host(root=True, user_namespaces=True, tools=True)) == []
    laptop = sandbox.protections_off(config, sandbox.Host(root=False, user_namespaces=False, tools=True))
    assert any("PID namespace" in line for line in laptop)
    assert any("network namespace" in line for line in laptop)
    assert any("RLIMIT_NPROC" in line for line in laptop)
    assert any("private filesystem view" in line for line in laptop)
    with_userns = sandbox.protections_off(config, sandbox.Host(root=False, user_namespaces=True, tools=True))
    assert not any("PID namespace" in line for line in with_userns)
    assert not any("filesystem view" in line for line in with_userns)
    assert "a user id per attempt (needs a root worker)" in with_userns
    root = sandbox.Host(root=True, user_namespaces=True, tools=True)
    host_net = sandbox.SandboxConfig.from_settings(replace(BASE, codex_network="host"))
    assert sandbox.protections_off(host_net, root) == ["network namespace (RECEIPT_CODEX_NETWORK=host)"]
    host_fs = sandbox.SandboxConfig.from_settings(replace(BASE, codex_filesystem="host"))
    assert sandbox.protections_off(host_fs, root) == [
        "private filesystem view (RECEIPT_CODEX_FILESYSTEM=host)"
    ]
    shared = sandbox.SandboxConfig.from_settings(replace(BASE, codex_uid_range="none"))
    assert [line.split(":")[0] for line in sandbox.protections_off(shared, root)] == [
        "a user id per attempt (RECEIPT_CODEX_UID_RANGE=none)"
    ]
    no_userns = sandbox.Host(root=True, user_namespaces=False, tools=True)
    assert [line.split(":")[0] for line in sandbox.protections_off(config, no_userns)] == [
        "a user namespace per command (this host refuses user namespaces)"
    ]
    old_kernel = sandbox.Host(root=True, user_namespaces=True, tools=True, views=False)
    assert [line.split(":")[0] for line in sandbox.protections_off(config, old_kernel)] == [
        "private filesystem view (needs mount_setattr, Linux 5.12+, on x86_64 or aarch64)"
    ]


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"codex_network": "bridge"}, "RECEIPT_CODEX_NETWORK"),
        ({"codex_memory_mb": 0}, "RECEIPT_CODEX_MEMORY_MB"),
        ({"codex_max_processes": -1}, "RECEIPT_CODEX_MAX_PROCESSES"),
        ({"codex_user": "receipt-no-such-user", "codex_uid_range": "none"}, "RECEIPT_CODEX_USER"),
        ({"codex_filesystem": "overlay"}, "RECEIPT_CODEX_FILESYSTEM"),
        ({"codex_visible_paths": "/usr,lib"}, "RECEIPT_CODEX_VISIBLE_PATHS"),
        ({"codex_visible_paths": "/usr,/"}, "RECEIPT_CODEX_VISIBLE_PATHS"),
        ({"codex_tmpfs_mb": 0}, "RECEIPT_CODEX_TMPFS_MB"),
        ({"codex_uid_range": "2000-1000"}, "RECEIPT_CODEX_UID_RANGE"),
        ({"codex_uid_range": "70000"}, "RECEIPT_CODEX_UID_RANGE"),
        ({"codex_uid_range": "65000-70000"}, "RECEIPT_CODEX_UID_RANGE"),  # holds nobody's 65534
        ({"codex_uid_range": "1-99"}, "RECEIPT_CODEX_UID_RANGE"),  # holds system users
        ({"codex_workspace_root": "/"}, "RECEIPT_CODEX_WORKSPACE_ROOT"),
    ],
)
def test_a_bad_sandbox_setting_fails_non_retryably_naming_it(
    queue: Queue, settings: Settings, change: dict[str, Any], named: str
) -> None:
    if "codex_user" in change and not HOST.root:
        pytest.skip("the sandbox user is only used by a root worker")
    job = enqueue(queue, "codex", max_attempts=3, command=["true"])
    out = run_attempt(queue, replace(settings, **change), default_registry(), job.id, 1)
    assert out.job is not None and (out.job.status, out.job.attempt) == ("failed", 1)
    assert named in out.job.error


def test_the_codex_worker_logs_once_at_start_which_protections_are_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from tasks.worker import log_sandbox_protections

    with caplog.at_level("INFO", logger="receipt.worker"):
        off = log_sandbox_protections(replace(BASE, codex_network="host"))
    assert off == sandbox.protections_off(
        sandbox.SandboxConfig.from_settings(replace(BASE, codex_network="host")), HOST
    )
    assert [r.getMessage() for r in caplog.records if "codex sandbox" in r.getMessage()] == [
        "codex sandbox: these protections are OFF on this host: " + "; ".join(off)
    ]


# -- the laptop modes, forced on this host: what a worker that is not root still gets ------------

REPORT = """
import os, resource
def soft(name):
    return resource.getrlimit(getattr(resource, name))[0]
print("uid", os.getuid(), "pid", os.getpid())
print("as", soft("RLIMIT_AS"), "fsize", soft("RLIMIT_FSIZE"), end=" ")
print("nofile", soft("RLIMIT_NOFILE"), "cpu", soft("RLIMIT_CPU"))
"""
CHILD = """
import subprocess, sys
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", sys.argv[1]])
"""


def _run_directly(host: sandbox.Host, argv: list[str], scratch_root: Path) -> tuple[int, str]:
    config = sandbox.SandboxConfig.from_settings(replace(BASE, codex_scratch_root=str(scratch_root)))
    with sandbox.attempt(config, host) as attempt:
        env = {"PATH": sandbox.SANDBOX_PATH}
        proc = sandbox.start(argv, env=env, cwd=attempt.scratch, config=config, host=host, attempt=attempt)
        assert proc.popen.stdout is not None
        proc.popen.wait(30)
        proc.finish()  # before reading: a child left alive would hold the pipe open
        out = proc.popen.stdout.read().decode()
        proc.popen.stdout.close()
    return proc.popen.returncode, out


def test_without_namespaces_the_rlimits_still_apply_and_the_group_is_killed(scratch_root: Path) -> None:
    marker = f"hostile-{uuid.uuid4().hex}"
    laptop = sandbox.Host(root=False, user_namespaces=False, tools=True)
    code, out = _run_directly(laptop, hostile(REPORT + CHILD, marker), scratch_root)
    assert code == 0, out
    assert f"as {1024 << 20} fsize {8 << 20} nofile 1024 cpu 20" in out
    assert marked(marker) == []  # the child stayed in the group, and the group was killed
    assert list(scratch_root.iterdir()) == []


@pytest.mark.skipif(not HOST.tools, reason="util-linux tools are missing")
def test_a_user_namespace_gives_a_worker_that_is_not_root_its_own_pid_namespace(scratch_root: Path) -> None:
    marker = f"hostile-{uuid.uuid4().hex}"
    laptop = sandbox.Host(root=False, user_namespaces=True, tools=True)
    code, out = _run_directly(laptop, hostile(REPORT, marker), scratch_root)
    assert code == 0, out
    assert "uid 0 pid 2" in out  # root only inside its own user namespace; PID 2 under the init
    assert f"as {1024 << 20}" in out
    assert marked(marker) == []
