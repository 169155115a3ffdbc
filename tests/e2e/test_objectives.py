"""Factory objectives end to end: real gunicorn, celery workers and beat on PostgreSQL and Redis.

Tasks run the ``e2e-task`` handler (``devharness/handlers.py``; it routes to the chat group like any
unknown agent id), so no command execution is needed. Each test counts receipts straight from
the database: "completed" alone never passes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from app.composition import queue_for
from app.factory import service
from app.factory.vocab import objective_stream, task_job_id
from app.jobs.ids import qualify
from app.jobs.vocab import TERMINAL_STATUSES
from app.storage import store
from app.storage.db import jobs
from devharness.credits import offer_slots, withdraw
from tests.support.processes import Harness
from tests.support.queue_ops import lease
from tests.support.stack import ORG, Stack, make_stack, worker_pid
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e")]

TASK = "e2e-task"
# Objective timings for the tests: control leases as short as the others (a dead control worker
# costs seconds, not 15 minutes), the outbox redrive twice a second, resume 0.3 s after start.
FACTORY_ENV = {
    "FACTORY_CONTROL_JOB_LEASE_MS": "6000",
    "RECEIPT_OBJECTIVE_CONTROL_OUTBOX_REDRIVE_INTERVAL_MS": "500",
    "RESONATE_STARTUP_SETTLE_MS": "300",
}
ALL = ("web", "driver", "chat", "codex", "control", "beat")


def task(tid: str, deps: list[str] | None = None, **payload: Any) -> dict[str, Any]:
    return {
        "id": tid,
        "agentId": TASK,
        "payload": {"kind": "factory.task.run", **payload},
        "dependsOn": deps or [],
    }


def launch(stack: Stack, tasks: list[dict[str, Any]], **extra: Any) -> str:
    body = {"title": "e2e", "goal": "prove it", "plan": {"tasks": tasks}, **extra}
    r = stack.http.post(stack.url("/objectives"), json=body, headers=stack.headers(), timeout=30)
    assert r.status_code == 202, r.text
    oid: str = r.json()["async"]["objectiveId"]
    return oid


def get(stack: Stack, oid: str) -> dict[str, Any]:
    r = stack.http.get(stack.url(f"/objectives/{oid}"), headers=stack.headers(), timeout=15)
    assert r.status_code == 200, r.text
    obj: dict[str, Any] = r.json()["objective"]
    return obj


def wait_objective(stack: Stack, oid: str, *statuses: str, timeout: float = 90) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        obj = get(stack, oid)
        return obj if obj["status"] in statuses else None

    return wait_for(check, timeout, interval=0.2, what=f"objective {oid} to be {'/'.join(statuses)}")


def wait_audited(stack: Stack, oid: str, timeout: float = 60) -> dict[str, Any]:
    return wait_for(lambda: get(stack, oid)["audit"], timeout, interval=0.2, what=f"audit of {oid}")


def task_jobs(stack: Stack, oid: str) -> list[Any]:
    with stack.engine.connect() as conn:
        rows = conn.execute(select(jobs.c.id, jobs.c.status, jobs.c.state)).all()
    return [
        r
        for r in rows
        if r.state["payload"].get("objectiveId") == oid and r.state["payload"]["kind"] == "factory.task.run"
    ]


def completions(stack: Stack, job_id: str) -> int:
    return sum(1 for r in stack.receipts(job_id) if r.type == "job.completed")


def objective_receipts(stack: Stack, oid: str) -> list[Any]:
    """The receipts of the stack organisation's objective ``oid`` (the client id the API answered)."""
    with stack.engine.connect() as conn:
        return store.read_stream(conn, objective_stream(qualify(ORG, oid)))


@pytest.fixture(scope="module")
def fstack(
    module_harness: Harness, module_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    stack = make_stack(
        module_harness, module_database_url, tmp_path_factory.mktemp("factory-home"), **FACTORY_ENV
    )
    try:
        stack.start(*ALL)
        yield stack
    finally:
        stack.close()
        module_harness.stop_all()


@pytest.fixture
def dstack(harness: Harness, pg_database_url: str, tmp_path: Path) -> Iterator[Stack]:
    """A dedicated deployment for one destructive test."""
    s = make_stack(harness, pg_database_url, tmp_path / "home", **FACTORY_ENV)
    try:
        yield s
    finally:
        s.close()
        harness.stop_all()


def test_diamond_completes_and_d_receives_b_and_c_results(fstack: Stack) -> None:
    oid = launch(fstack, [task("A"), task("B", ["A"]), task("C", ["A"]), task("D", ["B", "C"])])
    obj = wait_objective(fstack, oid, "completed")
    by_id = {t["id"]: t for t in obj["tasks"]}
    inputs = by_id["D"]["result"]["inputs"]
    assert set(inputs) == {"B", "C"}
    assert inputs["B"]["task"] == "B" and inputs["C"]["task"] == "C"
    assert inputs["B"]["inputs"]["A"]["task"] == "A"
    for t in "ABCD":
        assert completions(fstack, task_job_id(oid, 1, t)) == 1
    audit = wait_audited(fstack, oid)
    assert audit["tasksByStatus"] == {"completed": 4} and audit["verified"]["ok"] is True


def test_fifty_task_fan_out_fan_in_completes(fstack: Stack) -> None:
    middle = [task(f"m{i:02d}", ["root"]) for i in range(48)]
    oid = launch(fstack, [task("root"), *middle, task("sink", [m["id"] for m in middle])])
    obj = wait_objective(fstack, oid, "completed", timeout=180)
    sink = next(t for t in obj["tasks"] if t["id"] == "sink")
    assert len(sink["result"]["inputs"]) == 48
    rows = task_jobs(fstack, oid)
    assert len(rows) == 50 and {r.status for r in rows} == {"completed"}
    assert all(completions(fstack, r.id) == 1 for r in rows)


def test_fail_fast_cancels_the_active_tasks_and_skips_dependents(fstack: Stack) -> None:
    oid = launch(fstack, [task("bad", fail=True), task("slow", seconds=60), task("after", ["bad"])])
    obj = wait_objective(fstack, oid, "failed")
    st = {t["id"]: t["status"] for t in obj["tasks"]}
    assert st == {"bad": "failed", "slow": "canceled", "after": "skipped"}
    assert {r.status for r in task_jobs(fstack, oid)} <= set(TERMINAL_STATUSES)
    assert fstack.status(task_job_id(oid, 1, "after")) is None  # never enqueued
    audit = wait_audited(fstack, oid)
    assert audit["failures"][0]["taskId"] == "bad" and "failed on purpose" in audit["failures"][0]["error"]


def test_continue_lets_independent_branches_finish(fstack: Stack) -> None:
    tasks = [task("bad", fail=True), task("slow", seconds=1), task("after", ["bad"]), task("next", ["slow"])]
    oid = launch(fstack, tasks, failurePolicy="continue")
    obj = wait_objective(fstack, oid, "failed")
    st = {t["id"]: t["status"] for t in obj["tasks"]}
    assert st == {"bad": "failed", "slow": "completed", "after": "skipped", "next": "completed"}


def test_cancel_mid_flight_leaves_no_task_running(fstack: Stack, tmp_path: Path) -> None:
    gate = str(tmp_path / "never-opened")
    oid = launch(fstack, [task("a", gate=gate), task("b", gate=gate), task("c", ["a", "b"])])
    wait_for(
        lambda: {t["status"] for t in get(fstack, oid)["tasks"][:2]} == {"running"},
        60,
        what="a and b running",
    )
    r = fstack.http.post(
        fstack.url(f"/objectives/{oid}/cancel"), json={"reason": "stop"}, headers=fstack.headers()
    )
    assert r.status_code == 202
    obj = wait_objective(fstack, oid, "canceled")
    assert {t["id"]: t["status"] for t in obj["tasks"]} == {"a": "canceled", "b": "canceled", "c": "canceled"}
    rows = task_jobs(fstack, oid)
    assert len(rows) == 2 and {r.status for r in rows} == {"canceled"}
    again = fstack.http.post(fstack.url(f"/objectives/{oid}/cancel"), json={}, headers=fstack.headers())
    assert again.status_code == 409


def test_sigkilled_task_worker_recovers_through_lease_expiry_and_reconcile(
    dstack: Stack, tmp_path: Path
) -> None:
    dstack.start(*ALL)
    gate = tmp_path / "gate"
    oid = launch(dstack, [task("A", gate=str(gate), gateAttempts=[1]), task("B", ["A"])])
    a = task_job_id(oid, 1, "A")
    running = dstack.wait_running(a, attempt=1, timeout=60)
    assert running.lease is not None
    victim = worker_pid(running.lease.worker_id)
    assert victim == dstack.procs["chat"].pid
    dstack.harness.kill(dstack.procs.pop("chat"))
    dstack.start_worker("worker-chat", "chat-2")
    obj = wait_objective(dstack, oid, "completed", timeout=120)
    assert {t["id"]: t["status"] for t in obj["tasks"]} == {"A": "completed", "B": "completed"}
    types = [r.type for r in dstack.receipts(a)]
    assert "job.lease_expired" in types and types.count("job.completed") == 1
    assert completions(dstack, task_job_id(oid, 1, "B")) == 1
    done = next(t for t in obj["tasks"] if t["id"] == "A")
    assert done["attempt"] == 2 and done["result"]["pid"] != victim
    reasons = [
        r.body.get("reason")
        for r in objective_receipts(dstack, oid)
        if r.type == "objective.control_requested"
    ]
    assert "lease_expired" in reasons and "task_settled" in reasons


def test_broker_flushed_while_a_control_request_waits_the_outbox_redrive_finishes(dstack: Stack) -> None:
    # The queued-job redrive is pushed out of the way: only the outbox redrive may recover control.
    dstack.env_overrides["RECEIPT_RESONATE_QUEUED_REDRIVE_MIN_AGE_MS"] = "600000"
    dstack.start("web", "driver", "chat", "beat")  # no control worker: the control job's message waits
    # ... in Redis, sent to a slot offered for the control worker to come (the dispatch pass sends
    # only to offered slots).
    offer = offer_slots(dstack.engine, slots=1, queues=["receipt-control"])
    oid = launch(dstack, [task("A"), task("B", ["A"])])
    obj = service.find(dstack.engine, ORG, oid, all_tasks=False)
    # The launch's request waits (resume at startup may add one of its own if the objective was
    # launched before a process's settle delay ran out: both are recovered the same way).
    assert obj is not None and [r.reason for r in obj.pending][:1] == ["launch"]
    assert {r.reason for r in obj.pending} <= {"launch", "resume"}
    control = wait_for(
        lambda: [
            j
            for j in queue_for(dstack.engine)
            .list_jobs(all_organizations=True, agent_id="factory-control")
            .jobs
        ],
        30,
        what="the control job",
    )[0]
    assert control.status == "queued"
    wait_for(lambda: dstack.deliveries(control.id), 30, what="the control job's delivery")
    import redis

    client = redis.Redis.from_url(dstack.redis_url)
    # The worker message is waiting in the control queue (nobody consumes it): now lose it.
    wait_for(lambda: client.llen("receipt-control") >= 1, 30, what="the control message in Redis")
    client.flushdb()
    client.close()
    dstack.start_worker("worker-control", "control")
    withdraw(dstack.engine, offer)  # from here on, the real worker's own offer
    obj2 = wait_objective(dstack, oid, "completed", timeout=90)
    assert [t["status"] for t in obj2["tasks"]] == ["completed", "completed"]
    keys = [d.dispatch_key for d in dstack.deliveries(control.id)]
    assert any(":outbox:" in k for k in keys), keys  # delivered by the outbox redrive
    assert not any(":redrive:" in k for k in keys), keys


def test_processes_restart_mid_objective_and_resume_finishes_it(dstack: Stack) -> None:
    dstack.start("web")
    oid = launch(dstack, [task("A"), task("B", ["A"]), task("C", ["B"])])
    queue = queue_for(dstack.engine, control_fast_path=False)
    control = wait_for(
        lambda: queue.list_jobs(all_organizations=True, agent_id="factory-control").jobs,
        30,
        what="control job",
    )[0]
    # A control worker took the launch's control job and died mid-step: its lease outlives the test.
    assert lease(queue, control.id, "dead-host:1:deadbeef", 900_000, start=True).applied
    import redis

    client = redis.Redis.from_url(dstack.redis_url)
    client.flushdb()
    client.close()
    dstack.stop("web")
    dstack.env_overrides["FACTORY_CONTROL_JOB_LEASE_MS"] = "900000"
    dstack.start(*ALL)
    obj = wait_objective(dstack, oid, "completed", timeout=120)
    assert [t["status"] for t in obj["tasks"]] == ["completed", "completed", "completed"]
    reasons = [
        r.body.get("reason")
        for r in objective_receipts(dstack, oid)
        if r.type == "objective.control_requested"
    ]
    assert "resume" in reasons
    # The dead step's job is still leased: the resume, not its lease expiry, finished the objective.
    still = dstack.job(control.id)
    assert still is not None and still.status == "running"
    # Single-flight (a loop_runs claim, spaced by the settle time + 1 s): six processes booting over a
    # few seconds on two cores run at most one pass each, never two at once — not one pass per role each.
    assert 1 <= reasons.count("resume") <= len(ALL)


def test_the_event_stream_follows_an_objective_live_with_deltas_and_the_running_overlay(
    fstack: Stack, tmp_path: Path
) -> None:
    """Through gunicorn's gevent worker: the shared poller wakes the stream, the client applies it."""
    from receipt.client import Client

    gate = tmp_path / "gate"
    oid = launch(fstack, [task("A", gate=str(gate)), task("B", ["A"]), task("C", ["A"])])
    client = Client(fstack.url(""), token=fstack.token)
    seen = []
    for event in client.follow_objective(oid, timeout=120):
        seen.append(event)
        a = next(t for t in event.objective["tasks"] if t["id"] == "A")
        if a["status"] == "running" and not gate.exists():
            gate.write_text("go")  # A has been shown running: let it finish
    assert seen[0].event == "objective"
    first_running = next(
        e for e in seen if next(t for t in e.objective["tasks"] if t["id"] == "A")["status"] == "running"
    )
    # No objective receipt says "running": the stream learnt it from A's job (unless A was
    # already running when the snapshot was taken).
    assert first_running.event in ("task", "objective")
    if first_running is not seen[0]:
        assert first_running.event == "task" and first_running.seq is None
    assert sum(1 for e in seen if e.event == "delta") >= 4
    final = seen[-1].objective
    assert final["status"] == "completed" and final["audit"] is not None
    shown = get(fstack, oid)
    del shown["ledger"]
    assert final == shown
