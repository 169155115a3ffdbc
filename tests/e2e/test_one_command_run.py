"""The one-command run: ``receipt up`` with no services (embedded SQLite + folder broker).

Runs the real command line, takes the dev token from its output, runs a job over HTTP through
the same dispatch → driver → worker path, then presses Ctrl-C (SIGINT to the supervisor only)
and checks that every process it started is gone within its grace period.
"""

from __future__ import annotations

import re
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import requests

from app.ops.supervisor import STOP_GRACE_S
from devharness import handlers
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
    # The first screen (through "Press Ctrl-C") fits in 15 lines, and names the logs.
    wait_for(lambda: "Press Ctrl-C" in up.log(), 10, what="the end of the banner")
    first_screen = [*up.log().split("Press Ctrl-C", 1)[0].splitlines(), "Press Ctrl-C ..."]
    assert len(first_screen) <= 15, "\n".join(first_screen)
    assert f"Logs: {home.resolve() / 'logs'}/<role>.log" in up.log()
    assert "Running: web, driver, chat, codex, control, beat" in up.log()

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

    # /metrics adds up every process's counters (one multiprocess folder for the whole run):
    # the enqueue was counted by the web process, the settlement by the chat worker.
    def scraped() -> str | None:
        r = requests.get(f"{base}/metrics", headers={"Authorization": f"Bearer {system}"}, timeout=10)
        assert r.status_code == 200, r.text
        return r.text if 'receipt_jobs_settled_total{group="chat",status="completed"} 1.0' in r.text else None

    system = subprocess.run(
        [str(receipt), "token", "create", "--org", "ops", "--system"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.strip()
    text = wait_for(scraped, 30, interval=0.5, what="the chat worker's settlement in /metrics")
    assert 'receipt_jobs_enqueued_total{group="chat",lane="collect"} 1.0' in text
    assert 'receipt_jobs{agent="e2e-echo",group="chat",lane="collect",status="completed"} 1.0' in text
    org_scrape = requests.get(f"{base}/metrics", headers=auth, timeout=10)
    assert org_scrape.status_code == 403

    # Quiet: every child's output went to its own file, without the root or kombu warnings.
    logs = {p.stem: p.read_text() for p in (home / "logs").glob("*.log")}
    assert sorted(logs) == ["beat", "chat", "codex", "control", "driver", "web"]
    assert " ready." in logs["chat"] and "Booting worker" in logs["web"]
    for name, text in logs.items():
        assert "SecurityWarning" not in text and "No hostname was supplied" not in text, name
    assert "celery@" not in up.log() and "Booting worker" not in up.log()  # not on the terminal
    shown = subprocess.run(
        [str(receipt), "logs", "chat", "-n", "5"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr
    assert len(shown.stdout.splitlines()) == 5
    assert shown.stdout.splitlines()[-1] in (home / "logs" / "chat.log").read_text()

    # Every process alive now must be gone after Ctrl-C, including the children's own children.
    everyone = sorted(set(children) | set(descendants_of(up.pid)))
    harness.adopted.extend(everyone)
    assert len(everyone) >= SUPERVISED
    up.popen.send_signal(signal.SIGINT)
    code = up.popen.wait(timeout=STOP_GRACE_S + 10)
    wait_for(lambda: not any(pid_alive(p) for p in everyone), 5, what="every child to exit")

    assert code == 0, up.tail()
    assert "receipt up: stopped" in up.log()
    assert "did not stop in time" not in up.log(), up.tail()
