"""The objective watchdog end to end: real beat(s), workers and gunicorn on PostgreSQL and Redis.

The watchdog's cron is replaced by the test-only ``RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_TEST_TICK_S``
(a wall-clock-aligned tick every N seconds, the cron engine's leading seconds field), so a tick
costs seconds, not a minute. Absence is asserted against beat's own log: beat must have sent its other loops'
ticks several times while never sending a watchdog tick.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from app.composition import queue_for
from app.cron import next_after
from app.factory import service, storage
from app.factory.plan import validate_objective
from app.factory.reducer import Objective
from app.factory.vocab import objective_stream, task_job_id
from app.jobs.ids import qualify
from app.storage import store
from app.storage.db import db_now, jobs, transaction
from tests.support.processes import Harness
from tests.support.stack import Stack, make_stack
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e")]

TASK = "e2e-task"
AUTH = {"userId": "u1", "organizationId": "e2e-org"}
TICK_S = 2
WATCHDOG_ENV = {
    "FACTORY_CONTROL_JOB_LEASE_MS": "6000",
    # The outbox redrive is off in effect: only the watchdog may recover a lost objective.
    "RECEIPT_OBJECTIVE_CONTROL_OUTBOX_REDRIVE_INTERVAL_MS": "600000",
    "RESONATE_STARTUP_SETTLE_MS": "300000",  # no resume pass during the test either
    "RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_TEST_TICK_S": str(TICK_S),
    "RECEIPT_RESONATE_EXECUTE_CONCURRENCY": "4",
}
PROCS = ("driver", "chat", "control", "beat")


def plan(*task_ids: str, **payload: Any) -> dict[str, Any]:
    return {
        "tasks": [
            {"id": t, "agentId": TASK, "payload": {"kind": "factory.task.run", **payload}, "dependsOn": []}
            for t in task_ids
        ]
    }


def key(client_id: str) -> str:
    """The key of the e2e organisation's objective ``client_id`` (what the watchdog names it by)."""
    return qualify(AUTH["organizationId"], client_id)


def lost(stack: Stack, client_id: str) -> datetime:
    """Launch with no fast path, then mark the launch request consumed as if its control step died:
    the control request and the control job are both gone. Returns the database time of the loss."""
    quiet = queue_for(stack.engine, control_fast_path=False)
    body = {"objectiveId": client_id, "title": "t", "goal": "g", "plan": plan("A", "B")}
    objective_id = service.launch(
        quiet, validate_objective(body, auth_context=AUTH), launched_by=service.system_launcher()
    ).objective.id
    assert objective_id == key(client_id)
    with transaction(stack.engine) as conn:
        storage.lock(conn, objective_id)
        loaded = storage.load(conn, objective_id)
        assert loaded is not None
        done = [("objective.control_consumed", {"requestIds": ["launch"]})]
        storage.apply(conn, loaded, objective_id, done, at=db_now(conn))
        return db_now(conn)


def reconciles(stack: Stack, oid: str) -> list[dict[str, Any]]:
    """The reconcile requests on the e2e organisation's objective ``oid`` (its client id)."""
    with stack.engine.connect() as conn:
        receipts = store.read_stream(conn, objective_stream(key(oid)))
    return [
        dict(r.body.get("detail") or {})
        for r in receipts
        if r.type == "objective.control_requested" and r.body.get("reason") == "reconcile"
    ]


def watchdog_jobs(stack: Stack) -> list[Any]:
    with stack.engine.connect() as conn:
        rows = conn.execute(
            select(jobs.c.id, jobs.c.status, jobs.c.state).where(jobs.c.kind == "factory.objective.watchdog")
        ).all()
    return sorted(rows, key=lambda r: r.id)


def beat_sends(stack: Stack, name: str, entry: str) -> int:
    return stack.procs[name].log_count(f"Sending due task {entry} ")


@pytest.fixture(scope="module")
def shared_wstack(
    module_harness: Harness, module_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """The watchdog's deployment (one beat), shared by this module's tests that neither stop a
    process nor configure their own."""
    s = make_stack(
        module_harness, module_database_url, tmp_path_factory.mktemp("watchdog-home"), **WATCHDOG_ENV
    )
    try:
        s.start(*PROCS)
        yield s
    finally:
        s.close()
        module_harness.stop_all()


@pytest.fixture
def wstack(harness: Harness, pg_database_url: str, tmp_path: Path) -> Iterator[Stack]:
    s = make_stack(harness, pg_database_url, tmp_path / "home", **WATCHDOG_ENV)
    try:
        yield s
    finally:
        s.close()
        harness.stop_all()


def test_a_lost_objective_is_reconciled_within_one_tick_and_completes(shared_wstack: Stack) -> None:
    wstack = shared_wstack
    lost_at = lost(wstack, "wd-lost")
    # The watchdog, a system job over every organisation, names objectives by their keys.
    finding = {"objectiveId": key("wd-lost"), "reason": "no_active_objective_work"}

    def reconciler() -> Any:
        done = [j for j in watchdog_jobs(wstack) if j.status == "completed"]
        return next((j for j in done if finding in j.state["result"]["reconciled"]), None)

    by = wait_for(reconciler, 60, interval=0.2, what="a watchdog pass to reconcile wd-lost")
    first_after = next_after(f"*/{TICK_S} * * * * *", lost_at)
    # Found by the pass of the first tick after the loss, or earlier (a pass of an earlier tick that
    # ran late, after the loss). Passes run concurrently on the control worker, so the next tick's
    # pass may get there first; then the first one sees control due and skips it: hence one period.
    assert datetime.fromisoformat(by.state["payload"]["tick"]) <= first_after + timedelta(seconds=TICK_S)
    assert reconciles(wstack, "wd-lost") == [finding]  # exactly one request: nothing else wrote one

    def completed() -> Objective | None:
        o = service.get(wstack.engine, key("wd-lost"))
        return o if o is not None and o.status == "completed" else None

    obj = wait_for(completed, 90, interval=0.2, what="wd-lost to complete")
    assert {t.status for t in obj.tasks.values()} == {"completed"}
    assert reconciles(wstack, "wd-lost") == [
        {"objectiveId": key("wd-lost"), "reason": "no_active_objective_work"}
    ]


def test_a_stalled_task_is_flagged_past_its_threshold_and_computer_work_is_not(
    wstack: Stack, tmp_path: Path
) -> None:
    # Lease expiry is pushed out of the way so a silent job stays "running" for the watchdog to judge.
    wstack.env_overrides["RECEIPT_LEASE_EXPIRY_INTERVAL_MS"] = "600000"
    wstack.start(*PROCS)
    gate = str(tmp_path / "gate")
    q = queue_for(wstack.engine)
    for oid, path in (("wd-local", "local"), ("wd-computer", "computer")):
        body: dict[str, Any] = {"objectiveId": oid, "title": "t", "goal": "g", "plan": plan("A", gate=gate)}
        body["plan"]["tasks"][0]["executionPath"] = path
        service.launch(q, validate_objective(body, auth_context=AUTH), launched_by=service.system_launcher())
    for oid in ("wd-local", "wd-computer"):
        wstack.wait_running(task_job_id(oid, 1, "A"), timeout=60)
    chat = wstack.procs["chat"]
    os.kill(chat.pid, signal.SIGSTOP)  # the worker goes silent: no heartbeats, no progress
    try:
        flagged = wait_for(
            lambda: [
                d for d in reconciles(wstack, "wd-local") if d["reason"] == "active_objective_work_stalled"
            ],
            60,
            interval=0.2,
            what="the local task to be flagged as stalled",
        )[0]
        # Two heartbeats of a 6 s lease (heartbeat 2 s): flagged only once quiet for longer than 4 s.
        assert flagged["jobId"] == task_job_id(key("wd-local"), 1, "A")
        assert flagged["thresholdMs"] == 4000 and flagged["quietMs"] > 4000
        # Meanwhile the computer task, just as silent, is under its 15-minute threshold: by the time
        # two more ticks have run, still no reconcile for it.
        seen = len(watchdog_jobs(wstack))
        wait_for(lambda: len(watchdog_jobs(wstack)) >= seen + 2, 30, interval=0.2, what="two more ticks")
        assert reconciles(wstack, "wd-computer") == []
    finally:
        os.kill(chat.pid, signal.SIGCONT)
        Path(gate).touch()


def test_the_watchdog_is_off_with_enabled_0(wstack: Stack) -> None:
    wstack.env_overrides["RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_ENABLED"] = "0"
    wstack.env_overrides["RECEIPT_RETRY_SCAN_INTERVAL_MS"] = "500"
    wstack.start(*PROCS)
    lost(wstack, "wd-off")
    # Beat runs its other loops many times over (more than three test ticks' worth)...
    wait_for(lambda: beat_sends(wstack, "beat", "due-retries") >= 4 * TICK_S * 2, 60, what="beat to tick")
    # ...and never the watchdog: no tick sent, no job, the lost objective left as it was.
    assert beat_sends(wstack, "beat", "objective-watchdog") == 0
    assert watchdog_jobs(wstack) == []
    assert reconciles(wstack, "wd-off") == []


def test_two_beats_give_one_watchdog_job_per_tick(wstack: Stack) -> None:
    wstack.start(*PROCS, "beat-2")
    wait_for(
        lambda: min(beat_sends(wstack, b, "objective-watchdog") for b in ("beat", "beat-2")) >= 3,
        60,
        interval=0.2,
        what="both beats to send three watchdog ticks",
    )
    control = wstack.procs["control"]
    # Both beats' messages are consumed: six or more ticks delivered to the control worker.
    wait_for(
        lambda: control.log_count("Task receipt.objective_watchdog_tick[") >= 12,  # received + succeeded
        60,
        what="the ticks to be consumed",
    )
    ticks = [
        re.search(r"job (\S+) \(created=(\w+)\)", line)
        for line in control.lines_with("objective watchdog tick")
    ]
    created = [m.group(1) for m in ticks if m and m.group(2) == "True"]
    # Every tick enqueued exactly once: the second beat's message for a tick either finds the job
    # (created=False) or, arriving while the first pass holds the loop's claim, is dropped by it.
    assert len(created) == len(set(created)) >= 3
    # Read after the log: a later tick may have enqueued meanwhile, so the log's jobs are a subset.
    assert set(created) <= {j.id for j in watchdog_jobs(wstack)}


def test_a_computer_task_is_followed_by_its_monitor_until_it_ends(
    shared_wstack: Stack, tmp_path: Path
) -> None:
    wstack = shared_wstack
    gate = tmp_path / "gate"
    body: dict[str, Any] = {
        "objectiveId": "wd-mon",
        "title": "t",
        "goal": "g",
        "plan": plan("A", gate=str(gate)),
    }
    body["plan"]["tasks"][0]["executionPath"] = "computer"
    q = queue_for(wstack.engine)
    service.launch(q, validate_objective(body, auth_context=AUTH), launched_by=service.system_launcher())
    task_job = task_job_id("wd-mon", 1, "A")
    mon = f"{task_job}:monitor"
    wstack.wait_running(task_job, timeout=60)

    def reported_running() -> Any:
        bodies = [r.body.get("progress") for r in wstack.receipts(mon) if r.type == "job.progress"]
        return [b for b in bodies if b and b.get("status") == "running"]

    seen = wait_for(reported_running, 60, interval=0.2, what="the monitor's liveness report")[0]
    assert seen["taskJobId"] == task_job and seen["attempt"] == 1
    assert seen["stallThresholdMs"] == 900_000 and seen["sinceHeartbeatMs"] >= 0
    gate.touch()
    done = wstack.wait_status(mon, "completed", timeout=60)
    assert done.result["outcome"] == "terminal" and done.result["status"] == "completed"
    assert done.result["taskJobId"] == task_job  # named as its payload names it: the client id
    wait_for(
        lambda: (
            (o := service.find(wstack.engine, AUTH["organizationId"], "wd-mon")) is not None
            and o.status == "completed"
        ),
        60,
        what="wd-mon to complete",
    )
    assert reconciles(wstack, "wd-mon") == []
