"""End to end over HTTP: enqueue → a real worker process → settled, on one shared deployment.

One stack per module (gunicorn, driver, chat, codex and control workers, beat) on a fresh
PostgreSQL database and the shared Redis; every test uses its own jobs, so they do not interfere.
Receipts are read straight from the database to count them exactly.
"""

from __future__ import annotations

import uuid
from datetime import datetime

import pytest

from app.config import Settings
from app.jobs.errors import no_handler_message
from app.jobs.ids import SYSTEM_ORGANIZATION
from app.jobs.routing import EXECUTE_TASK, QUEUES
from app.storage.db import parse_iso
from app.storage.delivery import attempt_fence
from app.storage.store import StoredReceipt
from devharness import handlers
from tasks.celery_app import make_celery
from tests.support.stack import Stack, terminal_receipts, worker_pid
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e")]


def _at(receipt: StoredReceipt) -> datetime:
    at = parse_iso(receipt.at)
    assert at is not None
    return at


def test_chat_group_runs_a_registered_handler_to_completed(module_stack: Stack) -> None:
    s = module_stack
    job = s.post_job(handlers.ECHO, message="hello")
    assert job["status"] == "queued"
    assert job["route"]["workerGroup"] == "chat"

    done = s.wait_terminal(job["id"], timeout=20)

    assert done.status == "completed"
    assert done.attempt == 1
    assert done.result["echo"] == "hello"
    # It ran in the chat worker process, and nowhere else.
    assert done.result["pid"] == s.procs["chat"].pid
    assert s.types(job["id"]) == ["job.enqueued", "job.leased", "job.heartbeat", "job.completed"]
    # The HTTP view agrees with the receipts.
    assert s.get_job(job["id"])["status"] == "completed"


def test_codex_group_runs_the_command_and_reports_exit_code_and_output(module_stack: Stack) -> None:
    s = module_stack
    job = s.post_job("codex", "factory.task.run", command=["python3", "-c", "print('hi')"])
    assert job["route"]["workerGroup"] == "codex"

    done = s.wait_terminal(job["id"], timeout=30)

    assert done.status == "completed", (done.error, done.result)
    assert done.attempt == 1
    assert done.result["exitCode"] == 0
    assert done.result["outputTail"] == "hi\n"
    receipts = s.receipts(job["id"])
    leased = next(r for r in receipts if r.type == "job.leased")
    assert worker_pid(leased.body["workerId"]) == s.procs["codex"].pid
    progress = [r.body["progress"] for r in receipts if r.type == "job.progress"]
    assert "".join(p["output"] for p in progress) == "hi\n"
    assert len(terminal_receipts(receipts)) == 1


def test_control_group_runs_the_watchdog_with_a_system_token(module_stack: Stack) -> None:
    s = module_stack
    job = s.post_job("factory-control", "factory.objective.watchdog", system=True)
    assert job["route"]["workerGroup"] == "control"
    # A job without an authContext is the system's own: it lives in the reserved organisation.
    assert job["organizationId"] == SYSTEM_ORGANIZATION
    key = s.key(job["id"], SYSTEM_ORGANIZATION)

    done = s.wait_terminal(key, timeout=20)

    # The objective watchdog: one pass over the active objectives, reporting what it reconciled.
    assert done.status == "completed", (done.error, done.result)
    assert done.attempt == 1 and done.result["timedOut"] is False and "reconciled" in done.result
    leased = next(r for r in s.receipts(key) if r.type == "job.leased")
    assert worker_pid(leased.body["workerId"]) == s.procs["control"].pid
    # The system token reads it by naming that organisation (its own is another).
    assert s.get_job(job["id"], system=True, organization_id=SYSTEM_ORGANIZATION)["status"] == "completed"


def test_unknown_agent_fails_with_the_exact_message_and_is_not_retried(module_stack: Stack) -> None:
    s = module_stack
    agent = f"e2e-nobody-{uuid.uuid4().hex[:6]}"
    job = s.post_job(agent, max_attempts=3)
    assert job["route"]["workerGroup"] == "chat"

    done = s.wait_terminal(job["id"], timeout=20)

    assert done.status == "failed"
    assert done.error == no_handler_message(agent) == f"No handler for agent '{agent}'"
    # Attempts were left (maxAttempts 3) and none was used: the failure is non-retryable.
    assert done.attempt == 1
    assert done.result == {"status": "failed"}
    receipts = s.receipts(job["id"])
    assert [r.type for r in receipts] == ["job.enqueued", "job.leased", "job.heartbeat", "job.failed"]
    assert receipts[-1].body["retryable"] is False
    assert s.get_job(job["id"])["error"] == no_handler_message(agent)


def test_abort_of_a_running_job_cancels_it(module_stack: Stack) -> None:
    s = module_stack
    job = s.post_job(handlers.WAIT_CANCEL, seconds=30)
    running = s.wait_running(job["id"])
    holder = running.lease.worker_id if running.lease else None

    answered = s.cancel(job["id"], reason="e2e abort")
    assert answered["abortRequested"] is True
    assert answered["status"] == "running"  # only its worker can stop work in flight

    done = s.wait_terminal(job["id"], timeout=15)

    assert done.status == "canceled"
    receipts = s.receipts(job["id"])
    types = [r.type for r in receipts]
    aborts = [r for r in receipts if r.type == "queue.command" and r.body["type"] == "abort"]
    assert len(aborts) == 1 and aborts[0].body["reason"] == "e2e abort"
    # The handler itself saw the cancellation signal (it wrote progress before the settlement).
    saw = [r.body["progress"] for r in receipts if r.type == "job.progress"]
    assert saw == [{"sawCancel": "e2e abort", "pid": s.procs["chat"].pid}]
    assert types.index("queue.command") < types.index("job.progress") < types.index("job.canceled")
    terminals = terminal_receipts(receipts)
    assert len(terminals) == 1
    assert terminals[0].body["workerId"] == holder
    assert terminals[0].body["reason"] == "e2e abort"


def test_steer_and_follow_up_are_delivered_to_the_running_handler(module_stack: Stack) -> None:
    s = module_stack
    job = s.post_job(handlers.COMMANDS, expect=2)
    s.wait_running(job["id"])

    steer = s.command(job["id"], "steer", {"text": "go left"})
    follow = s.command(job["id"], "follow_up", {"text": "and then?"})
    sent_ids = [steer["commands"][-1]["id"], follow["commands"][-1]["id"]]

    done = s.wait_terminal(job["id"], timeout=15)

    assert done.status == "completed", done.error
    assert done.result["received"] == [
        {"id": sent_ids[0], "type": "steer", "payload": {"text": "go left"}},
        {"id": sent_ids[1], "type": "follow_up", "payload": {"text": "and then?"}},
    ]
    receipts = s.receipts(job["id"])
    consumed = [r.body["commandId"] for r in receipts if r.type == "queue.command.consumed"]
    assert consumed == sent_ids
    assert [c["consumed"] for c in s.get_job(job["id"])["commands"]] == [True, True]


def test_retryable_failure_is_retried_until_max_attempts_then_failed(module_stack: Stack) -> None:
    s = module_stack
    job = s.post_job(handlers.FAIL, max_attempts=3)

    done = s.wait_terminal(job["id"], timeout=45)

    assert done.status == "failed"
    assert done.attempt == 3
    assert done.error == "e2e failure on attempt 3"
    assert done.result == {"status": "failed"}
    receipts = s.receipts(job["id"])
    leases = [r.body["attempt"] for r in receipts if r.type == "job.leased"]
    failures = [(r.body["attempt"], r.body["retryable"]) for r in receipts if r.type == "job.failed"]
    assert leases == [1, 2, 3]
    assert failures == [(1, True), (2, True), (3, True)]
    # Only the last failure is terminal; the first two requeued the job.
    assert [r.type for r in receipts].count("job.enqueued") == 1
    # Retries back off exponentially (RECEIPT_RETRY_BACKOFF_MS=300 here: 300 ms, then 600 ms),
    # measured on the database clock from the failure to the next lease.
    failed_at = [_at(r) for r in receipts if r.type == "job.failed"]
    leased_at = [_at(r) for r in receipts if r.type == "job.leased"]
    waits_ms = [(leased_at[i + 1] - failed_at[i]).total_seconds() * 1000 for i in range(2)]
    assert waits_ms[0] >= 300 and waits_ms[1] >= 600, waits_ms
    # Only a failure that a retry follows carries retryAt; the last one ends the job.
    assert [r.body.get("retryAt") is not None for r in receipts if r.type == "job.failed"] == [
        True,
        True,
        False,
    ]
    # Each retry was delivered by the next generation of the job's own dispatch key (the
    # due-retries pass), not left for the queued redrive — with production defaults that loop
    # would hold every retry for 30-45 s.
    key = s.key(job["id"])  # the dispatch key is the job's storage key
    assert [(d.dispatch_key, d.generation, d.outcome) for d in s.deliveries(job["id"])] == [
        (key, 0, "failed"),
        (key, 1, "failed"),
        (key, 2, "failed"),
    ]


def test_duplicate_delivery_of_the_same_worker_message_is_inert(module_stack: Stack) -> None:
    s = module_stack
    gate = f"{s.home}/gate-{uuid.uuid4().hex[:8]}"
    job = s.post_job(handlers.GATE, gate=gate)
    job_id = s.key(job["id"])  # the worker message, its fence and its log lines carry the key
    running = s.wait_running(job_id)
    assert running.lease is not None
    owner = running.lease.worker_id
    fence = attempt_fence(job_id, 1)
    [first] = s.deliveries(job_id)  # the delivery the real attempt runs under
    args = [job_id, fence, first.dispatch_key, first.generation]
    chat = s.procs["chat"]
    done_line = f"Task {EXECUTE_TASK}[{fence}] succeeded"
    assert chat.log_count(done_line) == 0

    app = make_celery(Settings.from_env(s.env()))
    try:
        # 1. The same message again while the real attempt runs: it must not touch the job.
        app.send_task(EXECUTE_TASK, args=args, task_id=fence, queue=QUEUES["chat"])
        wait_for(lambda: chat.log_count(done_line) == 1, 15, what="the duplicate to be processed")
        assert chat.log_count(f"delivery {fence}: lease_lost") == 1

        open(gate, "w").close()
        done = s.wait_terminal(job_id, timeout=15)
        assert done.status == "completed" and done.attempt == 1
        after_real = s.receipts(job_id)

        # 2. The same message once more after the job settled: nothing at all may change.
        app.send_task(EXECUTE_TASK, args=args, task_id=fence, queue=QUEUES["chat"])
        late = f"delivery {fence}: terminal_state"
        wait_for(lambda: chat.log_count(late) == 1, 15, what="the late duplicate to be processed")
        wait_for(lambda: chat.log_count(done_line) >= 2, 15, what="the late duplicate's task line")
        # Celery logs no return value: not the duplicates', nor the real attempt's where it came as
        # a message (a worker that took the wake-up itself ran it with none).
        assert all("<redacted>" in line for line in chat.lines_with(done_line))
    finally:
        app.close()

    receipts = s.receipts(job_id)
    assert receipts == after_real
    # Every worker receipt on the stream is the real attempt's: one lease, one holder, one terminal.
    worker_receipts = [r for r in receipts if "workerId" in r.body]
    assert {r.body["workerId"] for r in worker_receipts} == {owner}
    assert [r.type for r in receipts].count("job.leased") == 1
    assert len(terminal_receipts(receipts)) == 1
    [delivery] = s.deliveries(job_id)
    assert (delivery.state, delivery.outcome) == ("settled", "completed")
