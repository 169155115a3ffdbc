"""The one-command run: ``receipt up`` with no services (embedded SQLite + folder broker).

Runs the real command line, takes the dev token from its output, runs a job over HTTP through
the same dispatch → driver → worker path, then presses Ctrl-C (SIGINT to the supervisor only)
and checks that every process it started is gone within its grace period.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from app.ops.supervisor import STOP_GRACE_S
from tests.e2e import handlers
from tests.support.processes import REPO_ROOT, Harness, base_env, descendants_of, pid_alive
from tests.support.waiting import free_port, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e")]

TOKEN_LINE = re.compile(r"Dev token \(organization 'dev'\): (\S+)")
# Six supervised processes: web, driver, chat, codex, control, beat (the Procfile minus Flower).
SUPERVISED = 6


def test_receipt_up_runs_a_job_embedded_and_ctrl_c_stops_every_process(
    harness: Harness, tmp_path: Path
) -> None:
    port = free_port()
    home = tmp_path / "home"
    receipt = REPO_ROOT / ".venv" / "bin" / "receipt"
    assert receipt.exists(), f"{receipt} is not installed"
    env = base_env(RECEIPT_HOME=str(home))
    assert "DATABASE_URL" not in env and "REDIS_URL" not in env  # the embedded default
    # From a neutral directory: nothing may depend on being started inside the checkout.
    up = harness.start("receipt-up", [str(receipt), "up", "--port", str(port)], env, cwd=tmp_path)

    match = wait_for(
        lambda: TOKEN_LINE.search(up.log()) or not up.alive(), 120, interval=0.25, what="the dev token line"
    )
    assert up.alive() and isinstance(match, re.Match), up.tail()
    token = match.group(1)
    assert "SQLite" in up.log() and "folder broker" in up.log()

    def supervised() -> list[int]:
        found = descendants_of(up.pid)
        return found if len(found) >= SUPERVISED else []

    children = wait_for(supervised, 30, what="the supervised processes")
    harness.adopted.extend(children)  # cleaned up by PID even if the supervisor fails to

    base = f"http://127.0.0.1:{port}"
    auth = {"Authorization": f"Bearer {token}"}
    with requests.Session() as http:
        body: dict[str, Any] = {
            "payload": {
                "kind": "factory.run",
                "message": "embedded",
                "authContext": {"userId": "dev-user", "organizationId": "dev"},
            }
        }
        r = http.post(f"{base}/agents/{handlers.ECHO}/jobs", json=body, headers=auth, timeout=15)
        assert r.status_code == 202, r.text
        job_id = r.json()["job"]["id"]

        def settled() -> dict[str, Any] | None:
            job: dict[str, Any] = http.get(f"{base}/jobs/{job_id}", headers=auth, timeout=10).json()["job"]
            return job if job["status"] in ("completed", "failed", "canceled") else None

        job = wait_for(settled, 60, interval=0.2, what="the embedded job to settle")
    assert job["status"] == "completed", job
    assert job["result"]["echo"] == "embedded"
    assert (home / "receipt.db").exists() and (home / "broker").is_dir()

    # Every process alive now must be gone after Ctrl-C, including the children's own children.
    everyone = sorted(set(children) | set(descendants_of(up.pid)))
    harness.adopted.extend(everyone)
    assert len(everyone) >= SUPERVISED
    started = time.monotonic()
    up.popen.send_signal(signal.SIGINT)
    code = up.popen.wait(timeout=STOP_GRACE_S + 10)
    wait_for(lambda: not any(pid_alive(p) for p in everyone), 5, what="every child to exit")
    elapsed = time.monotonic() - started

    assert code == 0, up.tail()
    assert "receipt up: stopped" in up.log()
    assert "did not stop in time" not in up.log(), up.tail()
    assert elapsed < STOP_GRACE_S + 5
