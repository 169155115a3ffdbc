"""Fault tests: processes, the broker and the database fail underneath running jobs.

Each test gets its own deployment (a fresh database and its own redis-server) because each one
breaks something. What each test proves is written up in
``docs/faults.md``. Short leases come from the environment (``FAST_TIMINGS``): lease 6 s,
execution timeout 5 s, heartbeat 2 s, lease expiry every 0.5 s, queued redrive every 1 s for
jobs queued at least 1 s.
"""

from __future__ import annotations

import functools
import signal
import time
import uuid
from pathlib import Path

import pytest
import redis
from sqlalchemy.engine import Engine, make_url

from app.composition import queue_for
from app.config import Settings, mask_url
from app.jobs.errors import no_handler_message
from app.jobs.routing import DISPATCH_TASK, DRIVER_QUEUE, EXECUTE_BATCH_TASK, EXECUTE_TASK, QUEUES
from app.jobs.validation import validate_enqueue
from devharness import handlers
from tasks.celery_app import make_celery
from tests.support.processes import Proc
from tests.support.queue_ops import complete, settle_canceled
from tests.support.services import TcpProxy
from tests.support.stack import ORG, Stack, key_of, terminal_receipts, terminate_backends, worker_pid
from tests.support.waiting import wait_for
from workers.loop_passes import REDRIVE_LOOP

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e")]


def _holder_proc(stack: Stack, job_id: str, names: tuple[str, ...]) -> tuple[str, int]:
    """Which of the named worker processes holds the job's lease: (name, pid)."""
    job = stack.job(job_id)
    assert job is not None and job.lease is not None
    pid = worker_pid(job.lease.worker_id)
    for name in names:
        if stack.procs[name].pid == pid:
            return name, pid
    raise AssertionError(f"lease holder pid {pid} is none of {names}")


def _one_of_each(stack: Stack, job_id: str) -> None:
    receipts = stack.receipts(job_id)
    types = [r.type for r in receipts]
    assert types.count("job.enqueued") == 1, types
    assert len(terminal_receipts(receipts)) == 1, types


# -- workers dying ---------------------------------------------------------------------------------


def test_sigkill_of_the_worker_mid_job_reruns_it_once_on_a_new_process(stack: Stack, tmp_path: Path) -> None:
    stack.start("web", "driver", "chat", "beat")
    # Attempt 1 blocks on a gate that never opens; any later attempt completes at once.
    job = stack.post_job(handlers.GATE, gate=str(tmp_path / "never"), gateAttempts=[1], max_attempts=3)
    job_id = job["id"]
    running = stack.wait_running(job_id)
    assert running.lease is not None
    assert worker_pid(running.lease.worker_id) == stack.procs["chat"].pid

    stack.harness.kill(stack.procs.pop("chat"))
    replacement = stack.start_worker("worker-chat", "chat-2")

    done = stack.wait_terminal(job_id, timeout=40)

    assert done.status == "completed"
    assert done.attempt == 2
    assert done.result["pid"] == replacement.pid
    receipts = stack.receipts(job_id)
    types = [r.type for r in receipts]
    expired = [r for r in receipts if r.type == "job.lease_expired"]
    assert len(expired) == 1 and expired[0].body["attempt"] == 1
    assert expired[0].body["workerId"] == running.lease.worker_id
    assert "job.failed" not in types
    assert [r.body["attempt"] for r in receipts if r.type == "job.leased"] == [1, 2]
    [terminal] = terminal_receipts(receipts)
    assert terminal.type == "job.completed" and worker_pid(terminal.body["workerId"]) == replacement.pid
    # Nothing of the dead attempt was written after its lease expired.
    after = receipts[receipts.index(expired[0]) + 1 :]
    assert all(r.body.get("workerId") != running.lease.worker_id for r in after)


def test_sigkill_of_a_worker_holding_a_batch_redelivers_every_job_of_it_which_completes_once(
    stack: Stack, tmp_path: Path
) -> None:
    """Four jobs in one ``receipt.execute_batch``; the worker has two slots, so it leases two and
    holds two unleased (a hold longer than the test). SIGKILL: the two leased come back through the
    worker-liveness loop, the two held through their fetch records (each its own delivery, lost
    with its fetcher)."""
    stack.env_overrides["RECEIPT_DELIVERY_BATCH_MAX"] = "8"
    stack.env_overrides["RECEIPT_DELIVERY_HOLD_MS"] = "60000"
    # The batch message's path: the driver scans, and the worker runs nothing without a message.
    stack.env_overrides["RECEIPT_WORKER_WAKES"] = "disabled"
    # The default lead, capped at the process's own two slots: the dispatch pass may send the
    # worker all four at once.
    stack.start("web")
    gate = tmp_path / "gate"
    # No driver yet: the four wait together, and the first scan claims them in one batch.
    ids = [stack.post_job(handlers.GATE, gate=str(gate), max_attempts=3)["id"] for _ in range(4)]
    first = stack.start_worker("worker-chat", "chat", RECEIPT_RESONATE_EXECUTE_CONCURRENCY="2")
    stack.start("driver", "beat")
    wait_for(lambda: first.log_count(f"{EXECUTE_BATCH_TASK}[") >= 1, 30, what="the batch to be fetched")
    wait_for(lambda: sum(stack.status(i) == "running" for i in ids) == 2, 30, what="two attempts to run")
    leased = [i for i in ids if stack.status(i) == "running"]
    held = [i for i in ids if i not in leased]
    # Never more attempts than the role's concurrency: the other two wait unleased.
    assert [(stack.status(i), stack.job(i).attempt) for i in held] == [("queued", 0)] * 2  # type: ignore[union-attr]

    stack.harness.kill(stack.procs.pop("chat"))  # SIGKILL: no hand-back, no record deleted
    gate.touch()
    replacement = stack.start_worker("worker-chat", "chat-2")

    for job_id in ids:
        done = stack.wait_terminal(job_id, timeout=60)
        assert done.status == "completed" and done.result["pid"] == replacement.pid, (job_id, done)
        _one_of_each(stack, job_id)
    for job_id in leased:
        assert stack.job(job_id).attempt == 2  # type: ignore[union-attr]
        assert stack.types(job_id).count("job.lease_expired") == 1
    for job_id in held:
        # Never leased by the dead worker: its first attempt ran on the replacement ...
        receipts = stack.receipts(job_id)
        assert [r.body["attempt"] for r in receipts if r.type == "job.leased"] == [1]
        assert "job.lease_expired" not in [r.type for r in receipts]
        # ... redelivered because its own delivery was judged lost with the process that fetched it.
        assert "fetcher_lost" in [d.outcome for d in stack.deliveries(job_id)]


def test_a_batch_s_attempts_behind_long_jobs_are_handed_back_and_run_on_a_process_with_free_slots(
    stack: Stack, tmp_path: Path
) -> None:
    """Four gated jobs in one batch to a worker with two slots: it runs two and, when no slot frees
    within the hold, hands the other two back in one message; a second worker takes and runs them
    while the first two still hold the first worker's slots."""
    stack.env_overrides["RECEIPT_DELIVERY_BATCH_MAX"] = "8"
    # Long jobs: an execution timeout (lease - 1 s) far past the test, so the first worker's slots
    # stay busy until the gate opens.
    stack.env_overrides["JOB_LEASE_MS"] = "120000"
    # The batch message's path: the driver scans, and the worker runs nothing without a message.
    stack.env_overrides["RECEIPT_WORKER_WAKES"] = "disabled"
    # The default lead, capped at the process's own two slots: the dispatch pass may send the
    # worker all four at once.
    stack.start("web")
    gate = tmp_path / "gate"
    ids = [stack.post_job(handlers.GATE, gate=str(gate))["id"] for _ in range(4)]
    busy = stack.start_worker("worker-chat", "chat", RECEIPT_RESONATE_EXECUTE_CONCURRENCY="2")
    stack.start("driver", "beat")
    wait_for(lambda: busy.log_count("no free slot: 2 fetched attempts handed back"), 30, what="the hand-back")
    first = [i for i in ids if stack.status(i) == "running"]
    assert len(first) == 2 and all(stack.status(i) == "queued" for i in ids if i not in first)
    free = stack.start_worker("worker-chat", "chat-2", RECEIPT_RESONATE_EXECUTE_CONCURRENCY="4")
    rest = [i for i in ids if i not in first]
    # The two run on the second worker while the first two still hold the first worker's slots.
    wait_for(lambda: all(stack.status(i) == "running" for i in rest), 30, what="the other two to run")
    assert all(stack.status(i) == "running" for i in first)
    gate.touch()
    for job_id in ids:
        done = stack.wait_terminal(job_id, timeout=60)
        assert done.status == "completed", (job_id, done)
        assert done.result["pid"] == (busy.pid if job_id in first else free.pid), job_id
        _one_of_each(stack, job_id)
        assert stack.job(job_id).attempt == 1  # type: ignore[union-attr]


def test_settlement_from_a_superseded_attempt_is_inert(stack: Stack, tmp_path: Path) -> None:
    # Two chat workers, one job slot each: a busy worker does not fetch, so a frozen one cannot
    # swallow the rerun's message.
    # Process liveness is another fence: a thawed worker whose renewals lapsed fences itself, and may
    # do so before its handler settles. Renewals every 5 minutes keep that layer out of the way here
    # (tests/e2e/test_worker_liveness.py covers it), so the settlement meets the attempt fence.
    stack.env_overrides.update(
        RECEIPT_WORKER_LIVENESS_INTERVAL_MS="300000",
        RECEIPT_WORKER_SELF_FENCE_MS="600000",
        RECEIPT_WORKER_DEAD_AFTER_MS="602000",
    )
    stack.start("web", "driver", "beat")
    workers = [
        stack.start_worker("worker-chat", name, wait=False, RECEIPT_RESONATE_EXECUTE_CONCURRENCY="1")
        for name in ("chat-a", "chat-b")
    ]
    for proc in workers:
        stack.wait_worker(proc)
        assert "concurrency: 1 (thread)" in proc.log()
    gate = tmp_path / "gate"
    job = stack.post_job(handlers.GATE, gate=str(gate), gateAttempts=[1], max_attempts=3)
    job_id = job["id"]
    running = stack.wait_running(job_id)
    assert running.lease is not None
    old_worker = running.lease.worker_id
    frozen_name, _ = _holder_proc(stack, job_id, ("chat-a", "chat-b"))
    other_name = "chat-b" if frozen_name == "chat-a" else "chat-a"
    frozen = stack.procs[frozen_name]

    # Freeze attempt 1 mid-run: it stops heartbeating, its lease expires, attempt 2 runs elsewhere.
    stack.harness.signal(frozen, signal.SIGSTOP)
    try:
        done = stack.wait_terminal(job_id, timeout=40)
        assert done.status == "completed" and done.attempt == 2
        assert done.result["pid"] == stack.procs[other_name].pid
        settled = stack.receipts(job_id)
        gate.touch()  # attempt 1's handler may now finish and try to settle
    finally:
        stack.harness.signal(frozen, signal.SIGCONT)

    key = stack.key(job_id)  # fences and the queue name the job by its storage key
    line = f"Task {EXECUTE_TASK}[{key}:attempt:1] succeeded"
    wait_for(lambda: frozen.lines_with(line), 20, what="the superseded attempt to end")
    # It reached its settlement and was refused by the attempt fence ...
    assert frozen.log_count(f"delivery {key}:attempt:1: settlement_conflict") == 1
    # ... and wrote nothing: the stream is exactly what it was when attempt 2 settled.
    assert stack.receipts(job_id) == settled
    _one_of_each(stack, job_id)
    expired = [r for r in settled if r.type == "job.lease_expired"]
    assert [(r.body["workerId"], r.body["attempt"]) for r in expired] == [(old_worker, 1)]
    after = settled[settled.index(expired[0]) + 1 :]
    assert all(r.body.get("workerId") != old_worker for r in after)

    # The same settlement written straight at the queue (every fenced write of attempt 1) is inert too.
    q = queue_for(stack.engine)
    assert not complete(q, key, old_worker, 1, {"late": True}).applied
    assert not q.fail(key, old_worker, 1, "late", retryable=False).applied
    assert not q.heartbeat(key, old_worker, 1, 6000).applied
    assert not q.progress(key, old_worker, 1, {"late": True}).applied
    assert not settle_canceled(q, key, old_worker, 1, "late").applied
    assert stack.receipts(job_id) == settled


# -- roles ---------------------------------------------------------------------------------------------


def test_unknown_agent_job_stays_queued_where_no_chat_worker_runs(stack: Stack) -> None:
    # Every role but worker-chat. Observation window: 3 s, three redrive intervals and three
    # times the redrive's minimum age -- long enough for every delivery path to have acted.
    stack.start("web", "driver", "codex", "control", "beat")
    agent = f"e2e-nobody-{uuid.uuid4().hex[:6]}"
    lonely = stack.post_job(agent)["id"]
    # The system's own job: it lives in the system organisation (its stream names its key).
    watchdog = key_of(stack.post_job("factory-control", "factory.objective.watchdog", system=True))

    observe_until = time.monotonic() + 3.0
    while time.monotonic() < observe_until:
        job = stack.job(lonely)
        assert job is not None and (job.status, job.attempt) == ("queued", 0)
        time.sleep(0.2)

    assert stack.types(lonely) == ["job.enqueued"]
    # No chat process offers a slot: the job waits in its line in PostgreSQL, not in the broker
    # (docs/dispatch.md), and says why.
    assert stack.deliveries(lonely) == []
    broker = redis.Redis.from_url(stack.redis_url)
    try:
        assert broker.llen(QUEUES["chat"]) == 0
    finally:
        broker.close()
    assert stack.get_job(lonely)["waiting"] == {"reason": "share", "key": None}
    # ... while the groups that do run keep working: the control worker ran the watchdog job (issue
    # 10: one pass over the active objectives; there are none here).
    ran = stack.wait_terminal(watchdog, timeout=10)
    assert ran.status == "completed" and ran.result["reconciled"] == [], (ran.error, ran.result)
    # And once a chat worker starts, the same job fails with the exact message, not retried.
    stack.start("chat")
    done = stack.wait_terminal(lonely, timeout=20)
    assert (done.status, done.error, done.attempt) == ("failed", no_handler_message(agent), 1)


# -- the broker losing messages ----------------------------------------------------------------------


def test_redis_flushed_with_jobs_queued_every_job_completes_via_redrive(stack: Stack) -> None:
    # No consumer runs: enqueue 20 jobs, whose wake-ups wait in Redis, then lose the broker's contents.
    stack.start("web")
    ids = [stack.post_job(handlers.ECHO, message=f"job {n}")["id"] for n in range(20)]
    broker = redis.Redis.from_url(stack.redis_url)
    try:
        assert broker.llen("receipt-driver") >= 1  # the wake-ups are waiting for a dispatcher
        broker.flushdb()
        assert broker.dbsize() == 0
    finally:
        broker.close()

    # Workers and beat come up on an empty broker: only the receipts say what to do.
    stack.start("driver", "chat", "beat")
    for job_id in ids:
        done = stack.wait_terminal(job_id, timeout=40)
        assert (done.status, done.attempt) == ("completed", 1)
    keys = []
    for job_id in ids:
        _one_of_each(stack, job_id)
        assert stack.types(job_id).count("job.leased") == 1
        [only] = stack.deliveries(job_id)
        keys.append(only.dispatch_key)
        assert only.dispatch_key in (stack.key(job_id), f"{stack.key(job_id)}:redrive:1:queued")
    # Every enqueue wake-up was flushed: the queued redrive moved the line (its deliveries under the
    # redrive key), and the jobs it could not send then went as places freed (under their own key).
    assert any(key.endswith(":redrive:1:queued") for key in keys), keys


def test_redis_restarted_with_jobs_in_flight_and_queued_every_job_completes(stack: Stack) -> None:
    server = stack.redis_server
    assert server is not None
    stack.start("web", "driver", "chat", "beat")
    workers = [stack.procs["driver"], stack.procs["chat"]]

    in_flight = [stack.post_job(handlers.SLEEP, seconds=3, max_attempts=3)["id"] for _ in range(4)]
    for job_id in in_flight:
        stack.wait_running(job_id, timeout=20)
    # Messages the workers hold delivered but not yet acked when the broker dies: tasks with a
    # countdown, like the first redrive beat sends at start. (All harmless when they run.)
    app = make_celery(Settings.from_env(stack.env()))
    try:
        held = {
            "driver": app.send_task(DISPATCH_TASK, args=[[]], queue=DRIVER_QUEUE, countdown=300).id,
            "chat": app.send_task(
                EXECUTE_TASK,
                args=["e2e-none", "e2e-none:attempt:1", "e2e-none", 0],
                queue=QUEUES["chat"],
                countdown=300,
            ).id,
        }
    finally:
        app.close()
    for name, task_id in held.items():
        received = functools.partial(stack.procs[name].log_count, f"[{task_id}] received")
        wait_for(received, 10, what=f"{name} to hold its countdown message")

    server.kill()
    assert not server.ping()
    # The API still takes jobs while the broker is down: the receipt is the outbox.
    queued = [
        stack.post_job(handlers.ECHO, message="during the outage", max_attempts=3)["id"] for _ in range(4)
    ]
    # Running jobs settle through PostgreSQL while the broker is still dead.
    for job_id in in_flight:
        done = stack.wait_terminal(job_id, timeout=20)
        assert (done.status, done.attempt) == ("completed", 1)
    for job_id in queued:
        assert stack.status(job_id) == "queued"
    # No worker process died of the broker going away: they wait to reconnect, they do not exit.
    assert [w.name for w in workers if not w.alive()] == [], "a worker exited on the broker outage"

    server.start()  # same port, empty: every message it held is gone
    for job_id in queued:
        done = stack.wait_terminal(job_id, timeout=60)
        assert done.status == "completed"
    for job_id in in_flight + queued:
        _one_of_each(stack, job_id)
    assert [w.name for w in workers if not w.alive()] == []


# -- the database going away -----------------------------------------------------------------------


def test_postgres_cut_mid_run_settlements_retry_and_every_job_completes(
    stack: Stack, pg_admin: Engine, tmp_path: Path
) -> None:
    target = make_url(stack.database_url)  # the machine's PostgreSQL or the session's private one
    assert target.host is not None and target.port is not None
    proxy = TcpProxy(target.host, target.port)
    try:
        via_proxy = target.set(port=proxy.port).render_as_string(hide_password=False)
        assert via_proxy != stack.database_url
        stack.start("web")  # the API talks to PostgreSQL directly; every worker goes through the proxy
        procs = [
            stack.start_worker(role, name, wait=False, DATABASE_URL=via_proxy)
            for name, role in (("driver", "driver"), ("chat", "worker-chat"))
        ]
        for proc in procs:
            stack.wait_worker(proc)
        stack.start_beat()
        chat = stack.procs["chat"]

        # 1. A blip shorter than the settlement retry budget (5 tries, 150 ms x try: ~1.5 s):
        #    handlers finish while the database is cut, and their settlements retry and succeed.
        gate = tmp_path / "gate"
        blip = [stack.post_job(handlers.GATE, gate=str(gate), max_attempts=4)["id"] for _ in range(6)]
        for job_id in blip:
            stack.wait_running(job_id)
        proxy.cut()
        gate.touch()
        time.sleep(0.6)  # the outage itself, not synchronisation
        assert proxy.refused > 0, "nothing tried to reach the database during the cut"
        proxy.restore()
        for job_id in blip:
            done = stack.wait_terminal(job_id, timeout=30)
            # Completed by the attempt that was running: no rerun was needed.
            assert (done.status, done.attempt) == ("completed", 1), (job_id, stack.types(job_id))
            _one_of_each(stack, job_id)
        # Noticed, and said once per outage: either the outage line (its probe found the database
        # cut) or, when the probe ran after the restore, the retry's own line; each outage said
        # ends with one "answers again" line.
        lost = f"DATABASE_URL={mask_url(via_proxy)}: lost — "
        back = f"DATABASE_URL={mask_url(via_proxy)}: answers again after "
        said = chat.log_count(lost)
        assert said <= 1 and said + chat.log_count("transient storage error") >= 1

        def ended_as_often_as_lost(proc: Proc) -> bool:
            return proc.log_count(back) == proc.log_count(lost)

        wait_for(functools.partial(ended_as_often_as_lost, chat), 10, what="the end of the outage said")
        assert chat.log_count("raised unexpected") == 0

        # 2. A longer outage that also kills every server connection (a PostgreSQL restart, as
        #    far as the clients can tell): ~3 s is past the retry budget, so a settlement caught in
        #    it gives up, its lease expires and the job reruns -- still exactly one terminal receipt.
        restart = [stack.post_job(handlers.SLEEP, seconds=1.5, max_attempts=4)["id"] for _ in range(10)]
        wait_for(lambda: sum(stack.status(j) == "running" for j in restart) >= 3, 20, what="jobs running")
        refused_before = proxy.refused
        proxy.cut()
        terminated = terminate_backends(pg_admin, stack.database_url)
        time.sleep(3.0)  # the outage itself, not synchronisation
        assert proxy.refused > refused_before
        proxy.restore()
        assert terminated >= 1
        for job_id in restart:
            done = stack.wait_terminal(job_id, timeout=60)
            assert done.status == "completed", (job_id, done.error, stack.types(job_id))
        for job_id in restart:
            _one_of_each(stack, job_id)
            receipts = stack.receipts(job_id)
            # A rerun only ever follows the end of the lost attempt (its lease expiring, or the
            # driver failing its stale lease), never runs beside it.
            reruns = [r.body["attempt"] for r in receipts if r.type == "job.leased"][1:]
            ended = [
                r.body["attempt"]
                for r in receipts
                if r.type == "job.lease_expired" or (r.type == "job.failed" and r.body["retryable"])
            ]
            assert ended == [a - 1 for a in reruns], [r.type for r in receipts]
        # The second outage is one more line in each worker's log, not one per failed retry.
        for proc in procs:
            assert proc.log_count(lost) <= 2
            wait_for(functools.partial(ended_as_often_as_lost, proc), 10, what="the end of each outage said")
        assert chat.log_count(lost) == said + 1
    finally:
        proxy.close()


# -- recovery loops ------------------------------------------------------------------------------------


def test_two_beats_at_once_still_deliver_each_stuck_job_once(stack: Stack) -> None:
    stack.start("driver", "chat", "beat-a", "beat-b")
    # Jobs written without any wake-up: only the queued redrive can deliver them.
    q = queue_for(stack.engine)
    ids = []
    for n in range(12):
        req = validate_enqueue(
            handlers.ECHO,
            {
                "payload": {
                    "kind": "factory.run",
                    "message": f"stuck {n}",
                    "authContext": {"userId": "e2e-user", "organizationId": ORG},
                }
            },
        )
        ids.append(q.enqueue(req).job.id)

    for job_id in ids:
        done = stack.wait_terminal(job_id, timeout=30)
        assert (done.status, done.attempt) == ("completed", 1)
    keys = []
    for job_id in ids:
        _one_of_each(stack, job_id)
        assert stack.types(job_id).count("job.leased") == 1
        # One delivery each, generation 0: the two beats' passes never sent a job twice. The redrive
        # moved the line under its key; what it could not send went as places freed.
        [(key, generation)] = [(d.dispatch_key, d.generation) for d in stack.deliveries(job_id)]
        assert generation == 0 and key in (job_id, f"{job_id}:redrive:1:queued")
        keys.append(key)
    assert any(key.endswith(":redrive:1:queued") for key in keys), keys

    # Both beats were really scheduling the loop ...
    due = "Sending due task queued-redrive"
    wait_for(
        lambda: all(stack.procs[b].log_count(due) >= 2 for b in ("beat-a", "beat-b")),
        10,
        what="both beats to send redrive ticks",
    )
    # ... and no two redrive passes ever ran at the same time (single flight).
    # Each pass that ran logs "started" then "finished" inside its claim; an overlap would show
    # two "started" lines in a row.
    marks = [
        line.rsplit(": pass ", 1)[1]
        for line in stack.procs["driver"].lines_with(f"loop {REDRIVE_LOOP}: pass ")
    ]
    assert marks, "no redrive pass ran"
    complete = marks[:-1] if marks[-1] == "started" else marks  # a pass may be running right now
    assert complete == ["started", "finished"] * (len(complete) // 2), marks
