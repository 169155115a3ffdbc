"""Recovery under compound faults: broker loss with deliveries in flight, and beat gone.

Each test gets its own deployment (fresh database, own redis-server). Short timings come from
``FAST_TIMINGS`` (lease 6 s, lease expiry every 0.5 s, queued redrive every 1 s for jobs queued
at least 1 s). What each proves is written up in ``docs/faults.md``.
"""

from __future__ import annotations

import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import redis
import requests
from sqlalchemy.engine import Engine, make_url

from app.composition import queue_for
from app.config import Settings
from app.jobs.validation import validate_enqueue
from app.ops import loop_registry
from delivery import fetches
from devharness import handlers
from tasks.celery_app import make_celery
from tests.support.services import TcpProxy
from tests.support.stack import ORG, Stack, terminal_receipts, terminate_backends, waiting_fences, worker_pid
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e")]

CHAT = "receipt-chat"


def _one_terminal(stack: Stack, job_id: str) -> None:
    receipts = stack.receipts(job_id)
    assert len(terminal_receipts(receipts)) == 1, [r.type for r in receipts]


@pytest.mark.parametrize("loss", ["flushall", "restart"])
def test_after_the_broker_loses_queued_deliveries_every_job_is_delivered_again_at_once(
    stack: Stack, loss: str
) -> None:
    # A chat worker that offers its slots but consumes nothing: every job is dispatched to its free
    # places, and its worker message waits in Redis.
    stack.start("web", "driver", "beat")
    stack.start_worker("worker-chat", RECEIPT_RESONATE_EXECUTE_CONCURRENCY="20")
    control = make_celery(Settings.from_env(stack.env()))
    assert control.control.cancel_consumer(CHAT, reply=True, timeout=5, limit=1)
    control.close()
    ids = [stack.post_job(handlers.ECHO, message=f"job {n}")["id"] for n in range(20)]
    broker = redis.Redis.from_url(stack.redis_url)
    try:
        fences = sorted(f"{stack.key(j)}:attempt:1" for j in ids)

        def waiting() -> list[str]:
            # Attempts, not messages: a scan sends those bound for one queue in batch messages.
            return sorted(waiting_fences(broker, "receipt-chat"))

        wait_for(lambda: waiting() == fences, 60, what="every job's message to wait")
        # Redrive passes run every second meanwhile; none sends a second message beside a live one.
        time.sleep(2.5)  # an observation window of two redrive intervals past the minimum age
        assert waiting() == fences
        assert all(sum(d.state == "pending" for d in stack.deliveries(j)) == 1 for j in ids)
        if loss == "flushall":
            broker.flushall()
        else:
            assert stack.redis_server is not None
            stack.redis_server.kill()
            stack.redis_server.start()  # same port, empty
        lost_at = time.monotonic()
        # Redelivered: a fresh message per job is waiting again (no chat worker yet), long before
        # the 120 s driver timeout.
        wait_for(lambda: sorted(set(waiting())) == fences, 60, what="every job to be sent again")
        recovered_s = time.monotonic() - lost_at
    finally:
        broker.close()
    print(f"\n[{loss}] every queued job sent again {recovered_s:.1f} s after the loss")
    for job_id in ids:
        # Superseded as lost: its broker epoch changed (broker_lost), or -- when a pass still held
        # the epoch it read just before the loss (cached up to 0.5 s) -- because the broker held no
        # message it could be (presumed_lost). Either way, at once rather than after 120 s.
        outcomes = {d.outcome for d in stack.deliveries(job_id) if d.state == "settled"}
        assert outcomes & {"broker_lost", "presumed_lost"}, outcomes

    # A new connection: the broker it knew may be gone. The worker answers once it reconnected.
    control = make_celery(Settings.from_env(stack.env()))
    wait_for(
        lambda: control.control.add_consumer(CHAT, reply=True, timeout=2, limit=1),
        60,
        ignore=(redis.exceptions.ConnectionError,),
        what="the worker to consume again",
    )
    control.close()
    for job_id in ids:
        done = stack.wait_terminal(job_id, timeout=60)
        assert (done.status, done.attempt) == ("completed", 1)
        _one_terminal(stack, job_id)
        assert all(d.state == "settled" for d in stack.deliveries(job_id))  # nothing left pending


def test_with_beat_killed_and_kept_down_a_killed_workers_job_and_lost_wakeups_still_recover(
    stack: Stack, tmp_path: Path
) -> None:
    # The control worker too: with beat down it is what runs the Factory's loops (/readyz checks them).
    stack.start("web", "driver", "chat", "control", "beat")
    stack.harness.kill(stack.procs.pop("beat"))  # and it stays down
    job = stack.post_job(handlers.GATE, gate=str(tmp_path / "never"), gateAttempts=[1], max_attempts=3)
    job_id = job["id"]
    running = stack.wait_running(job_id)
    assert running.lease is not None and worker_pid(running.lease.worker_id) == stack.procs["chat"].pid
    stack.harness.kill(stack.procs.pop("chat"))
    replacement = stack.start_worker("worker-chat", "chat-2")

    # Jobs written without any wake-up message: only the queued redrive can deliver them.
    q = queue_for(stack.engine)
    stuck = []
    for n in range(5):
        payload = {"kind": "factory.run", "message": f"stuck {n}"}
        payload_ctx: dict[str, Any] = {
            **payload,
            "authContext": {"userId": "e2e-user", "organizationId": ORG},
        }
        body: dict[str, Any] = {"payload": payload_ctx}
        stuck.append(q.enqueue(validate_enqueue(handlers.ECHO, body)).job.id)

    done = stack.wait_terminal(job_id, timeout=60)
    assert (done.status, done.attempt) == ("completed", 2)
    assert done.result["pid"] == replacement.pid
    assert "job.lease_expired" in stack.types(job_id)
    _one_terminal(stack, job_id)
    for sid in stuck:
        assert stack.wait_terminal(sid, timeout=60).status == "completed"
        _one_terminal(stack, sid)
    # The driver's local ticker ran the loops, since nothing else did ...
    assert stack.procs["driver"].log_count("local ticker ran") >= 1

    # ... and keeps them fresh enough for /readyz (the ticker steps in at 2 intervals, /readyz
    # fails at 3; bounded wait, since a loaded machine can delay one tick).
    def ready() -> bool:
        r = stack.http.get(stack.url("/readyz"), headers=stack.headers(), timeout=10)
        return r.status_code == 200 and r.json()["loops"] == "ok"

    wait_for(ready, 30, what="/readyz to be ready with beat down")


def test_readyz_fails_when_no_process_runs_the_loops(stack: Stack) -> None:
    # Beat and the only maintenance consumer stopped: nothing recovers, and /readyz says so. No
    # control worker runs either, so the Factory's loops never run: short periods make them overdue
    # within the wait too.
    stack.env_overrides["RECEIPT_OBJECTIVE_CONTROL_OUTBOX_REDRIVE_INTERVAL_MS"] = "1000"
    stack.env_overrides["RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_TEST_TICK_S"] = "1"
    stack.start("web", "driver", "beat")
    stack.harness.signal(stack.procs["beat"], signal.SIGKILL)
    stack.harness.signal(stack.procs["driver"], signal.SIGKILL)

    def not_ready() -> dict[str, Any] | None:
        r = stack.http.get(stack.url("/readyz"), headers=stack.headers(), timeout=10)
        if r.status_code != 503:
            return None
        body: dict[str, Any] = r.json()
        return body if all(run["overdue"] for run in body["error"]["details"]["loopRuns"].values()) else None

    # The slowest loop (redrive, every 1 s) is overdue 3 s after its last run.
    body = wait_for(not_ready, 30, what="/readyz to call every loop overdue")
    details = body["error"]["details"]
    assert details["loops"].startswith("overdue:")
    # Every loop the registry runs for this deployment's settings is reported (and overdue).
    active = {loop.name for loop in loop_registry.active(Settings.from_env(stack.env()))}
    assert set(details["loopRuns"]) == active
    assert {"queued-redrive", "due-retries", "lease-expiry", "objective-watchdog"} <= active


def test_a_message_whose_fetcher_is_killed_before_it_acts_is_delivered_again_within_seconds(
    stack: Stack,
) -> None:
    """Early acks: a worker that fetched the execute message and is SIGKILLed before its lease
    receipt took the message with it. Its delivery is known lost (delivery/fetches.py) as soon as
    the worker's liveness key lapses, not after the 120 s driver timeout; while the fetcher lives,
    or while the message may still wait in the broker, nothing is sent beside it."""
    observe_s = fetches.LIVENESS_TTL_MS / 1000 + 2.5  # the liveness TTL plus two redrive intervals
    target = make_url(stack.database_url)  # the machine's PostgreSQL or the session's private one
    assert target.host is not None and target.port is not None
    proxy = TcpProxy(target.host, target.port)
    broker = redis.Redis.from_url(stack.redis_url)

    def record(task_id: str) -> str:
        raw = broker.get(fetches.FETCH_PREFIX + task_id)
        return raw.decode() if isinstance(raw, bytes) else str(raw or "")

    try:
        # (1) The driver that sent a worker message dies while the message waits (a chat worker
        # offers its slots but consumes nothing).
        stack.start("web", "driver", "beat")
        stack.start_worker("worker-chat", "parked")
        control = make_celery(Settings.from_env(stack.env()))
        assert control.control.cancel_consumer(CHAT, reply=True, timeout=5, limit=1)
        control.close()
        first = stack.post_job(handlers.ECHO, message="waits")["id"]
        wait_for(lambda: broker.llen("receipt-chat") == 1, 30, what="the worker message to wait")
        (sent,) = stack.deliveries(first)
        assert record(sent.task_id).startswith("sent ")
        stack.harness.kill(stack.procs.pop("driver"))
        stack.start("driver")
        time.sleep(observe_s)  # the fault's duration: the dead driver's liveness key has lapsed
        assert [d.state for d in stack.deliveries(first)] == ["pending"]
        assert broker.llen("receipt-chat") == 1

        stack.stop("parked")  # it never fetched the message, which still waits
        # (2) A chat worker whose database stalls fetches a message and cannot lease: it is alive.
        via_proxy = target.set(port=proxy.port).render_as_string(hide_password=False)
        assert via_proxy != stack.database_url
        # It takes no wake-ups (RECEIPT_WORKER_WAKES): its scan would stall on the held database
        # with the job's wake-up, and the job would wait for the queued redrive instead of being
        # claimed by the driver and fetched here as a message, which is the case under test.
        held = stack.start_worker(
            "worker-chat", "chat", DATABASE_URL=via_proxy, RECEIPT_WORKER_WAKES="disabled"
        )
        done = stack.wait_terminal(first)
        assert (done.status, done.attempt) == ("completed", 1)
        assert [d.outcome for d in stack.deliveries(first)] == ["completed"]
        proxy.hold()
        job_id = stack.post_job(handlers.ECHO, message="fetched then killed")["id"]

        def fetched_by_held() -> bool:
            rows = stack.deliveries(job_id)
            value = record(rows[0].task_id) if rows else ""
            return value.startswith("worker ") and f":{held.pid}:" in value

        wait_for(fetched_by_held, 30, what="the held chat worker to fetch the message")
        time.sleep(observe_s)  # the fault's duration: a live fetcher's message is never superseded
        assert [d.state for d in stack.deliveries(job_id)] == ["pending"]
        assert stack.types(job_id) == ["job.enqueued"]

        # (3) SIGKILL it before it leases; a new chat worker takes the job's next generation.
        stack.harness.kill(stack.procs.pop("chat"))
        killed_at = time.monotonic()
        stack.start_worker("worker-chat", "chat-2")
        done = stack.wait_terminal(job_id, timeout=60)
        recovered_s = time.monotonic() - killed_at
    finally:
        proxy.release()
        broker.close()
        proxy.close()
    print(f"\n[fetcher killed] completed {recovered_s:.1f} s after the SIGKILL (driver timeout 120 s)")
    assert recovered_s < 20, recovered_s
    assert (done.status, done.attempt) == ("completed", 1)
    receipts = stack.receipts(job_id)
    assert [r.type for r in receipts].count("job.leased") == 1  # the killed worker never leased
    assert [r.type for r in terminal_receipts(receipts)] == ["job.completed"]
    assert done.result["pid"] == stack.procs["chat-2"].pid
    assert [(d.purpose, d.outcome) for d in stack.deliveries(job_id)] == [
        ("dispatch", "fetcher_lost"),
        ("redrive", "completed"),
    ]


def test_enqueues_over_gunicorn_while_postgres_drops_the_apis_connections_answer_202_or_503(
    stack: Stack, pg_admin: Engine
) -> None:
    """The soak's PostgreSQL restarts, on the deployed web process: every enqueue answers 202 or
    503 ``unavailable`` with Retry-After (never another 5xx), and every 202 job exists."""
    stack.start_web(RECEIPT_RATE_LIMIT_WRITES="disabled")  # the write limit is not under test
    outcomes: dict[str, tuple[int, str, str | None]] = {}
    lock = threading.Lock()
    stop = threading.Event()

    def client(n: int) -> None:
        with requests.Session() as http:
            i = 0
            while not stop.is_set():
                job_id = f"pg-drop-{n}-{i}"
                i += 1
                body: dict[str, Any] = {
                    "jobId": job_id,
                    "payload": {
                        "kind": "factory.run",
                        "message": "x",
                        "authContext": {"userId": "e2e-user", "organizationId": ORG},
                    },
                }
                r = http.post(
                    stack.url(f"/agents/{handlers.ECHO}/jobs"), json=body, headers=stack.headers(), timeout=30
                )
                code = r.json().get("error", {}).get("code", "") if r.status_code >= 400 else ""
                with lock:
                    outcomes[job_id] = (r.status_code, code, r.headers.get("Retry-After"))

    threads = [threading.Thread(target=client, args=(n,)) for n in range(4)]
    terminated = 0
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 4.0
        while time.monotonic() < deadline:  # the fault: a restart's worth of dropped connections
            terminated += terminate_backends(pg_admin, stack.database_url)
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=60)
    counts = Counter(status for status, _, _ in outcomes.values())
    print(f"\n[gunicorn, backends dropped] {dict(counts)}, {terminated} backends terminated")
    assert terminated > 0 and counts[202] > 0, counts
    assert set(counts) <= {202, 503}, counts
    for job_id, (status, code, retry_after) in outcomes.items():
        if status == 503:
            assert code == "unavailable" and retry_after is not None and int(retry_after) >= 1
        job = stack.job(job_id)
        if status == 202:
            assert job is not None, f"{job_id} answered 202 but does not exist"
        if job is not None:  # whole, never partial: its projection and its one enqueued receipt
            assert stack.types(job_id) == ["job.enqueued"]
        else:
            assert stack.receipts(job_id) == []
