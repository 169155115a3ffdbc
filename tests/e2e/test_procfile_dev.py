"""The README's local Procfile command, run as written under honcho on a database nobody migrated.

``receipt migrate && honcho -f Procfile.dev start`` with only ``DATABASE_URL`` and ``REDIS_URL``
set (and the harness's ``PATH``, ``HOME`` and base ``PORT``): every process stays up, Flower
without credentials included (on loopback only, with one warning line), a job posted over HTTP
completes, and one SIGTERM to honcho leaves no process it started behind.
"""

from __future__ import annotations

import os
import signal
import socket
from pathlib import Path
from typing import Any

import pytest
import requests
from sqlalchemy.engine import Engine

from app.storage import tokens
from app.storage.db import make_engine
from tests.support.databases import new_database
from tests.support.processes import REPO_ROOT, Harness, children_of, descendants_of, pid_alive
from tests.support.services import RedisServer
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e")]

# The command the README gives for a local run, word for word.
COMMAND = "receipt migrate && honcho -f Procfile.dev start"
# Procfile.dev's processes in file order: honcho gives the n-th one PORT = base + 100 * n.
PROCESSES = ("web", "driver", "chat", "codex", "control", "beat", "flower")
PORT_STEP = 100
FLOWER_WARNING = "Flower runs without authentication, so only on 127.0.0.1"


def test_procfile_dev_lists_the_procfiles_processes_without_release() -> None:
    def lines(name: str) -> dict[str, str]:
        text = (REPO_ROOT / name).read_text().splitlines()
        return dict(line.split(": ", 1) for line in text if line and not line.startswith("#"))

    procfile, dev = lines("Procfile"), lines("Procfile.dev")
    assert procfile.pop("release") == "receipt migrate"  # a PaaS's release phase keeps its meaning
    assert dev == procfile
    assert tuple(dev) == PROCESSES
    assert COMMAND in (REPO_ROOT / "README.md").read_text()


def free_port_range(count: int) -> int:
    """A base port such that base, base + 100, ... (``count`` of them) are free at the moment."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + PORT_STEP * count >= 65536:
            continue
        try:
            for n in range(count):
                with socket.socket() as probe:
                    probe.bind(("0.0.0.0", base + PORT_STEP * n))
        except OSError:
            continue
        return base
    raise AssertionError("no free range of ports")


def listening_addresses(port: int) -> set[str]:
    """The local addresses (hex, as /proc/net/tcp* prints them) listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            address, hex_port = fields[1].rsplit(":", 1)
            if fields[3] == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


def is_honcho(pid: int) -> bool:
    """honcho's own process (its argv names the honcho script), not the shell that started it."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    return any(Path(arg.decode()).name == "honcho" for arg in argv[:2])


@pytest.fixture
def fresh_database_url(pg_admin: Engine) -> Any:
    """A PostgreSQL database nobody migrated: the command's own `receipt migrate` must."""
    with new_database(pg_admin, "receipt_procfile") as url:
        yield url


def test_the_readmes_procfile_command_runs_a_job_and_sigterm_leaves_nothing(
    harness: Harness, fresh_database_url: str, tmp_path: Path
) -> None:
    redis = RedisServer(harness)
    redis.start()
    base = free_port_range(len(PROCESSES))
    ports = {name: base + PORT_STEP * n for n, name in enumerate(PROCESSES)}
    env = {
        "PATH": f"{REPO_ROOT / '.venv' / 'bin'}:/usr/bin:/bin",
        "HOME": str(tmp_path),
        "PORT": str(base),
        "DATABASE_URL": fresh_database_url,
        "REDIS_URL": redis.url,
    }
    runner = harness.start("honcho", ["sh", "-c", COMMAND], env, cwd=REPO_ROOT)
    url = f"http://127.0.0.1:{ports['web']}"

    def ready() -> bool | None:
        if not runner.alive():
            return True  # stop waiting: the assertion below says why
        try:
            return requests.get(f"{url}/readyz", timeout=2).status_code == 200 or None
        except requests.RequestException:
            return None

    wait_for(ready, 120, interval=0.5, what="the web process's /readyz without a token")
    assert runner.alive(), runner.tail()
    everyone = descendants_of(runner.pid)
    harness.adopted.extend(everyone)  # stopped by PID even if honcho fails to
    assert "database at revision" in runner.log()  # the command migrated the fresh database

    engine = make_engine(fresh_database_url)
    try:
        _info, secret = tokens.create(engine, "procfile")
    finally:
        engine.dispose()
    auth = {"Authorization": f"Bearer {secret}"}
    # A factory.run whose goal carries its plan: the built-in handlers, nothing registered. Commands
    # are off here, so its one task runs none (a plan with one would be refused at the door).
    task = {"id": "hello", "agentId": "factory", "payload": {"kind": "factory.task.run"}}
    body: dict[str, Any] = {
        "payload": {
            "kind": "factory.run",
            "authContext": {"userId": "procfile", "organizationId": "procfile"},
            "plan": {"tasks": [task]},
        }
    }
    with requests.Session() as http:
        posted = http.post(f"{url}/agents/factory/jobs", json=body, headers=auth, timeout=15)
        assert posted.status_code == 202, posted.text
        job_id = posted.json()["job"]["id"]

        def settled() -> dict[str, Any] | None:
            job: dict[str, Any] = http.get(f"{url}/jobs/{job_id}", headers=auth, timeout=10).json()["job"]
            return job if job["status"] in ("completed", "failed", "canceled") else None

        job = wait_for(settled, 60, interval=0.2, what="the job to settle")
    assert job["status"] == "completed", job

    # Every process is still up, Flower too: on loopback alone, and it said why once.
    assert runner.alive(), runner.tail()
    log = runner.log()
    for name in PROCESSES:
        assert f"{name}.1 started" in log, name
        assert f"{name}.1 stopped" not in log and f"{name}.1 exited" not in log, runner.tail()
    wait_for(lambda: listening_addresses(ports["flower"]) or None, 30, what="Flower to listen")
    assert listening_addresses(ports["flower"]) == {"0100007F"}  # 127.0.0.1, nothing else
    assert log.count(FLOWER_WARNING) == 1

    # One SIGTERM to honcho: every process it started (walked before stopping) is gone.
    everyone = sorted(set(everyone) | set(descendants_of(runner.pid)))
    harness.adopted.extend(everyone)
    [honcho] = [runner.pid] if is_honcho(runner.pid) else [p for p in children_of(runner.pid) if is_honcho(p)]
    assert len(everyone) >= len(PROCESSES)
    os.kill(honcho, signal.SIGTERM)
    runner.popen.wait(timeout=30)
    wait_for(lambda: not any(pid_alive(p) for p in everyone) or None, 15, what="every process to exit")
    assert [p for p in everyone if pid_alive(p)] == []
