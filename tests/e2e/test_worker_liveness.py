"""A dead worker is noticed in seconds, not a lease (real processes, real signals, a real partition).

- SIGKILL to a worker running a job with a 7-minute lease: the job runs again on the other worker
  within 15 s (the worker-liveness loop expires it once the dead process's record lapses past
  ``RECEIPT_WORKER_DEAD_AFTER_MS``, 10 s by default; redelivery follows in the same commit).
- A partitioned codex worker (its PostgreSQL and Redis connections go through TCP proxies the test
  cuts) fences itself and kills its command *before* its job is handed to another worker: the
  command's own marker file stops before the ``job.lease_expired`` receipt, which comes before the
  second attempt's command writes its first line.

The liveness settings are production's defaults here; only the job's lease is set, to 7 minutes.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from app.jobs.times import parse_iso
from devharness import handlers
from tests.support.services import TcpProxy
from tests.support.stack import Stack, worker_pid
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e")]

SEVEN_MINUTES_MS = "420000"
RUNNING_AGAIN_WITHIN_S = 15.0
# The command of the partition test: one line per 50 ms with the host's time, in a file of its own
# (each attempt's command runs under its own user id, so it cannot append to the other's).
MARKER_COMMAND = (
    "import os, sys, time, uuid\n"
    "path = os.path.join(sys.argv[1], 'marker-' + uuid.uuid4().hex)\n"
    "with open(path, 'w') as f:\n"
    "    for _ in range(6000):\n"
    "        f.write(repr(time.time()) + '\\n'); f.flush(); time.sleep(0.05)\n"
)


def test_a_sigkilled_worker_holding_a_7_minute_lease_has_its_job_running_again_within_15_s(
    stack: Stack, tmp_path: Path
) -> None:
    stack.timings["JOB_LEASE_MS"] = SEVEN_MINUTES_MS
    stack.start("web", "driver", "beat")
    first = stack.start_worker("worker-chat", "chat-1")
    gate = tmp_path / "open"
    job = stack.post_job(handlers.GATE, gate=str(gate), max_attempts=3)
    running = stack.wait_running(job["id"], timeout=30)
    assert running.lease is not None and worker_pid(running.lease.worker_id) == first.pid
    assert parse_iso(running.lease.expires_at) is not None
    second = stack.start_worker("worker-chat", "chat-2")

    stack.harness.kill(stack.procs.pop("chat-1"))  # SIGKILL: no hand-back, no record deleted
    killed_at = time.monotonic()
    again = stack.wait_running(job["id"], attempt=2, timeout=RUNNING_AGAIN_WITHIN_S + 30)
    took = time.monotonic() - killed_at
    print(f"\n[sigkill] job running again on the other worker {took:.1f} s after the kill (7-minute lease)")
    assert again.lease is not None and worker_pid(again.lease.worker_id) == second.pid
    assert took < RUNNING_AGAIN_WITHIN_S, f"running again only after {took:.1f} s"
    expired = [r for r in stack.receipts(job["id"]) if r.type == "job.lease_expired"]
    assert len(expired) == 1 and expired[0].body["error"].endswith("liveness lapsed")
    assert expired[0].body["workerId"] == running.lease.worker_id
    # The attempt's own deadline was minutes away: the lease-expiry loop played no part.
    deadline, at = parse_iso(expired[0].body["expiresAt"]), parse_iso(expired[0].at)
    assert deadline is not None and at is not None and (deadline - at).total_seconds() > 300
    gate.touch()
    done = stack.wait_terminal(job["id"], timeout=30)
    assert (done.status, done.attempt, done.result["pid"]) == ("completed", 2, second.pid)


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    # Written by sandboxed commands under their own user ids: a 0777 folder outside pytest's 0700 tree.
    path = Path(tempfile.mkdtemp(prefix="receipt-liveness-", dir="/tmp"))
    os.chmod(path, 0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _lines(path: Path) -> list[float]:
    return [float(x) for x in path.read_text().split()]


@pytest.mark.parametrize("partition", ["cut", "stall"])
def test_a_partitioned_worker_kills_its_command_before_its_job_runs_elsewhere(
    stack: Stack, shared_dir: Path, partition: str
) -> None:
    """``cut``: every connection is closed and new ones refused. ``stall``: connections stay open and
    no byte moves, so the worker's threads that touch the database block (its handler thread too):
    the fence must still kill the command."""
    stack.timings["CODEX_JOB_LEASE_MS"] = SEVEN_MINUTES_MS
    stack.env_overrides["RECEIPT_CODEX_WORKSPACE_ROOT"] = str(shared_dir)
    pg, rd = make_url(stack.database_url), make_url(stack.redis_url)
    pg_proxy = TcpProxy(pg.host or "127.0.0.1", pg.port or 5432)
    redis_proxy = TcpProxy(rd.host or "127.0.0.1", rd.port or 6379)
    try:
        stack.start("web", "driver", "beat")
        cut_off = stack.start_worker(
            "worker-codex",
            "codex-1",
            DATABASE_URL=pg.set(port=pg_proxy.port).render_as_string(hide_password=False),
            REDIS_URL=rd.set(port=redis_proxy.port).render_as_string(hide_password=False),
        )
        job = stack.post_job(
            "codex",
            "factory.task.run",
            command=["python3", "-c", MARKER_COMMAND, str(shared_dir)],
            max_attempts=3,
        )
        running = stack.wait_running(job["id"], timeout=30)
        assert running.lease is not None and worker_pid(running.lease.worker_id) == cut_off.pid
        first_marker = wait_for(
            lambda: next(iter(shared_dir.glob("marker-*")), None), 30, what="the command to run"
        )
        wait_for(lambda: len(_lines(first_marker)) >= 5, 10, what="the command to write")
        stack.start_worker("worker-codex", "codex-2")

        for proxy in (pg_proxy, redis_proxy):
            if partition == "cut":
                proxy.cut()
            else:
                proxy.hold()
        cut_at = time.time()
        again = stack.wait_running(job["id"], attempt=2, timeout=60)
        assert again.lease is not None and worker_pid(again.lease.worker_id) == stack.procs["codex-2"].pid
        second_marker = wait_for(
            lambda: next((p for p in shared_dir.glob("marker-*") if p != first_marker), None),
            30,
            what="the second attempt's command to run",
        )
        wait_for(lambda: len(_lines(second_marker)) >= 1, 10, what="the second command to write")

        first_stopped = _lines(first_marker)[-1]
        second_started = _lines(second_marker)[0]
        expired = [r for r in stack.receipts(job["id"]) if r.type == "job.lease_expired"]
        assert len(expired) == 1 and expired[0].body["error"].endswith("liveness lapsed"), expired
        expired_at = parse_iso(expired[0].at)
        assert expired_at is not None
        handed_over = expired_at.timestamp()
        print(
            f"\n[partition {partition}] command stopped {first_stopped - cut_at:.2f} s after the cut; "
            f"job expired {handed_over - cut_at:.2f} s after it; "
            f"second command started {second_started - cut_at:.2f} s after it"
        )
        # Same host, same clock: the first command was dead before the job was handed over, and the
        # second command started after that.
        assert first_stopped < handed_over < second_started
        # And it stopped because the worker fenced itself (not long after the cut: not at the 7-minute lease).
        assert first_stopped - cut_at < 10
        wait_for(lambda: cut_off.log_count("worker fenced itself") >= 1, 10, what="the fence's log line")
        # The first marker stays still: nothing of the first command survived.
        size = first_marker.stat().st_size
        time.sleep(0.5)  # an observation window: ten of the command's write intervals
        assert first_marker.stat().st_size == size
    finally:
        pg_proxy.close()
        redis_proxy.close()
