"""A planned restart hands running work back at once, with a receipt, uncharged (real processes,
real signals).

Two signal patterns, as platforms send them: SIGTERM to the worker alone (Kubernetes, ``docker
stop``), and SIGTERM to every process at once (Heroku: the worker, the sandbox and the command a
``codex`` job runs, plus the driver and beat). Leases are long (2 minutes) and the queued redrive
is slow, so a job that runs again promptly can only have come back through ``job.released`` and
its wake-up, never through lease expiry or a redrive.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from app.composition import queue_for
from app.jobs.times import parse_iso
from devharness import handlers
from receipt.client import Client
from tests.support.processes import Proc, descendants_of
from tests.support.stack import ORG, Stack, worker_pid
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e")]

GRACE_MS = 3_000  # finish window 2 s, stop window 1 s
SLOW = {
    "RECEIPT_SHUTDOWN_GRACE_MS": str(GRACE_MS),
    "JOB_LEASE_MS": "120000",
    "CODEX_JOB_LEASE_MS": "120000",
    "RECEIPT_RESONATE_QUEUED_REDRIVE_INTERVAL_MS": "60000",
    "RECEIPT_RESONATE_QUEUED_REDRIVE_MIN_AGE_MS": "60000",
}
EXIT_BOUND_S = GRACE_MS / 1000 + 3  # the grace, plus the interpreter's own exit
PROMPT_BOUND_S = 30.0  # the released job runs again without the queued redrive (held off 60 s)


def _slow(stack: Stack) -> None:
    stack.timings.update(SLOW)


def _exited_within(proc: Proc, bound_s: float) -> float:
    started = time.monotonic()
    code = proc.popen.wait(timeout=bound_s)
    proc.stopped = True
    assert code == 0, f"{proc.name} exited with {code}:\n{proc.tail(40)}"
    return time.monotonic() - started


def _released_after(stack: Stack, job_id: str, signalled_at: float) -> float:
    """Seconds from the signal to the ``job.released`` receipt (the database's clock, this host)."""
    [released] = [r for r in stack.receipts(job_id) if r.type == "job.released"]
    at = parse_iso(released.at)
    assert at is not None
    return at.timestamp() - signalled_at


def _released_once_then_rerun(stack: Stack, job_id: str, old_pid: int, new_pid: int) -> None:
    receipts = stack.receipts(job_id)
    types = [r.type for r in receipts]
    [released] = [r for r in receipts if r.type == "job.released"]
    assert released.body["reason"] == "shutdown" and released.body["attempt"] == 1
    assert worker_pid(released.body["workerId"]) == old_pid
    assert "job.failed" not in types and "job.lease_expired" not in types
    leases = [r for r in receipts if r.type == "job.leased"]
    assert [r.body["attempt"] for r in leases] == [1, 2]
    # No overlap: the second lease follows the release, and nothing of attempt 1 comes after it.
    assert leases[1].seq > released.seq
    assert worker_pid(leases[1].body["workerId"]) == new_pid
    assert all(r.body.get("attempt") != 1 for r in receipts if r.seq > released.seq)


def test_sigterm_to_the_worker_alone_releases_its_job_which_completes_on_the_next_worker(
    stack: Stack, tmp_path: Path
) -> None:
    _slow(stack)
    stack.start("web", "driver", "chat", "beat")
    # maxAttempts 1: the job can only complete on the next worker if the release was not charged.
    job = stack.post_job(handlers.GATE, gate=str(tmp_path / "never"), gateAttempts=[1], max_attempts=1)
    job_id = job["id"]
    running = stack.wait_running(job_id)
    old = stack.procs.pop("chat")
    assert running.lease is not None and worker_pid(running.lease.worker_id) == old.pid
    replacement = stack.start_worker("worker-chat", "chat-2")

    signalled_at = time.time()
    os.kill(old.pid, signal.SIGTERM)  # the worker alone, as Kubernetes sends it to PID 1
    took = _exited_within(old, EXIT_BOUND_S)
    assert took < GRACE_MS / 1000 + 1.5, f"the worker took {took:.1f} s to exit"

    done = stack.wait_terminal(job_id, timeout=20)
    assert done.status == "completed", (done.status, done.error)
    assert done.result["pid"] == replacement.pid
    assert (done.attempt, done.released, done.charged_attempts) == (2, 1, 1)
    _released_once_then_rerun(stack, job_id, old.pid, replacement.pid)
    assert "handed back" in old.log()
    # The handler ignored nothing: it ran through the finish window, then was cancelled and
    # released inside the grace.
    after = _released_after(stack, job_id, signalled_at)
    assert 2.0 - 0.3 <= after < GRACE_MS / 1000, after


def test_sigterm_to_every_process_at_once_hands_the_codex_job_back_and_a_new_deploy_runs_it(
    stack: Stack,
) -> None:
    _slow(stack)
    stack.start("web", "driver", "codex", "beat")
    job = stack.post_job(
        "codex", "factory.task.run", command=["/bin/sleep", "60"], max_attempts=1, progress=True
    )
    job_id = job["id"]
    running = stack.wait_running(job_id)
    codex, driver, beat = (stack.procs.pop(n) for n in ("codex", "driver", "beat"))
    assert running.lease is not None and worker_pid(running.lease.worker_id) == codex.pid
    # The whole tree, once the command itself runs (not while the sandbox is still being set up).
    command_tree = wait_for(lambda: _tree_running(codex.pid, "/bin/sleep"), timeout=10, what="the command")

    # Heroku: every process of every dyno at once, the command and its sandbox included.
    signalled_at = time.time()
    for pid in [codex.pid, *command_tree, driver.pid, beat.pid]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    for proc in (codex, driver, beat):
        _exited_within(proc, EXIT_BOUND_S)
    assert not [p for p in command_tree if _alive(p)], "a process of the command outlived its worker"

    # The command died of the same SIGTERM: a shutdown, not a failure, so the job waits, queued.
    queued = stack.wait_status(job_id, "queued", timeout=5)
    assert queued.released == 1 and queued.charged_attempts == 0
    # Released when the command died, well before the finish window (2 s) would have cancelled it.
    assert _released_after(stack, job_id, signalled_at) < 1.5

    # The new release starts.
    stack.start("driver-2", "codex-2")
    # The queued redrive waits 60 s (ENV), so running well before that is the released job's own
    # dispatch, not a recovery pass; how fast it is, is bench/deploy_soak.py's figure.
    again = stack.wait_running(job_id, attempt=2, timeout=PROMPT_BOUND_S)
    assert again.lease is not None
    _released_once_then_rerun(stack, job_id, codex.pid, stack.procs["codex-2"].pid)
    stack.cancel(job_id, "test over")
    assert stack.wait_terminal(job_id, timeout=15).status == "canceled"


def _tree_running(pid: int, command: str) -> list[int] | None:
    """Every descendant of ``pid``, once one of them runs ``command``."""
    tree = descendants_of(pid)
    return tree if any(_cmdline(p).startswith(command) for p in tree) else None


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(")")[-1].split()[0] != "Z"


def test_a_follower_across_a_web_restart_misses_and_repeats_nothing(stack: Stack) -> None:
    """SIGTERM to the web process: its open event stream ends at once with a ``retry:`` (not at the
    graceful timeout), the client resumes on the next web process from ``Last-Event-ID``, and the
    states it receives are every receipt's, each once, in order, including those written while no
    web process ran."""
    _slow(stack)  # the job outlives the restart: no 5 s execution timeout
    stack.start("web", "driver", "chat")
    job = stack.post_job(handlers.COMMANDS, expect=3)
    job_id = job["id"]
    stack.wait_running(job_id)
    client = Client(stack.url(""), token=stack.token, timeout=15)
    seen: list[tuple[int, str]] = []
    box: dict[str, BaseException] = {}

    def follow() -> None:
        try:
            for event in client.follow(job_id, reconnect_delay=0.2, timeout=60):
                seen.append((event.seq, event.status))
        except BaseException as exc:  # reported by the test below
            box["error"] = exc

    follower = threading.Thread(target=follow, daemon=True)
    follower.start()
    stack.command(job_id, "steer", payload={"n": 1})
    wait_for(lambda: len(seen) >= 5, timeout=15, what="the first command's states")

    web = stack.procs.pop("web")
    os.kill(web.pid, signal.SIGTERM)  # the graceful timeout is 19 s: the stream must not hold it
    took = _exited_within(web, 10)
    # Well inside the 19 s graceful timeout; what remains is an idle keep-alive connection's (1 s here).
    assert took < 8, f"the web process took {took:.1f} s to drain"
    assert "event streams told to reconnect" in web.log()
    queue = queue_for(stack.engine)
    queue.command(stack.key(job_id), "steer", payload={"n": 2})  # written while no web process runs

    stack.start_web("web-2")
    stack.command(job_id, "steer", payload={"n": 3})
    done = stack.wait_terminal(job_id, timeout=20)
    assert done.status == "completed", (done.error, stack.types(job_id))
    follower.join(20)
    assert not follower.is_alive() and "error" not in box, box
    last = stack.receipts(job_id)[-1].seq
    assert [s for s, _ in seen] == list(range(1, last + 1))  # every state, once, in order
    assert seen[-1][1] == "completed"


def test_a_post_in_flight_when_the_web_is_told_to_stop_still_finishes(stack: Stack) -> None:
    """SIGTERM while a request is half sent: the web stops accepting, but the request in flight is
    read to its end, answered and written (gunicorn's graceful stop, inside the grace)."""
    stack.start("web")
    body = json.dumps(
        {
            "jobId": "in-flight",
            "payload": {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": ORG}},
        }
    ).encode()
    head = (
        f"POST /agents/{handlers.ECHO}/jobs HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {stack.token}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    web = stack.procs.pop("web")
    with socket.create_connection(("127.0.0.1", stack.web_port), timeout=15) as sock:
        sock.sendall(head + body[:10])
        os.kill(web.pid, signal.SIGTERM)
        wait_for(lambda: "draining:" in web.log(), timeout=10, what="the web worker to begin its stop")
        sock.sendall(body[10:])
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 202"), answer[:200]
    _exited_within(web, 10)
    assert stack.status("in-flight") == "queued"  # written, though no worker runs to take it
