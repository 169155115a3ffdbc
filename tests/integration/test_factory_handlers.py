"""The factory handlers (dispatch, run + planner, the not-yet-built ones) and the Factory loops."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from app.config import Settings
from app.factory import loops as loops_objectives
from app.factory import service
from app.jobs.validation import validate_enqueue
from app.ops import loops as registry
from app.storage import loops
from app.storage.queue import Queue
from tests.factory_support import DIAMOND, drain, plan

AUTH = {"userId": "u1", "organizationId": "org-a"}


def post(queue: Queue, agent: str, kind: str, **payload: Any) -> str:
    body: dict[str, Any] = {"payload": {"kind": kind, **payload}}
    if kind != "factory.objective.watchdog":
        body["payload"]["authContext"] = AUTH
    return queue.enqueue(validate_enqueue(agent, body)).job.id


def objective_body(**extra: Any) -> dict[str, Any]:
    return {"objectiveId": "disp-1", "title": "t", "goal": "g", "plan": plan(DIAMOND), **extra}


def test_factory_dispatch_launches_once_by_objective_id(sqlite_engine: Engine) -> None:
    queue = Queue(sqlite_engine)
    first = post(queue, "factory", "factory.dispatch", objective=objective_body())
    second = post(queue, "factory", "factory.dispatch", objective=objective_body(title="again"))
    drain(queue)
    a, b = queue.get(first), queue.get(second)
    assert a is not None and a.status == "completed" and a.result["created"] is True
    assert b is not None and b.status == "completed" and b.result["created"] is False
    obj = service.get(sqlite_engine, "disp-1")
    assert obj is not None and obj.status == "completed" and obj.title == "t"
    # The dispatch job was enqueued with no recorded enqueuer: the objective it launched holds no
    # rights (a launch never acts with more rights than whoever asked for it).
    assert obj.launched_by == {"tokenId": None, "scopes": [], "system": False}


def test_factory_dispatch_refuses_a_bad_objective_without_retrying(sqlite_engine: Engine) -> None:
    queue = Queue(sqlite_engine)
    job_id = post(queue, "factory", "factory.dispatch", objective=objective_body(plan={"tasks": []}))
    drain(queue)
    job = queue.get(job_id)
    assert job is not None and job.status == "failed" and job.attempt == 1
    assert "plan.tasks" in job.error and "empty" in job.error


def test_factory_run_launches_an_explicit_plan_and_refuses_a_written_goal(sqlite_engine: Engine) -> None:
    queue = Queue(sqlite_engine)
    ok = post(
        queue, "factory", "factory.run", goal={"text": "do it", "plan": plan({"A": []})}, objectiveId="run-1"
    )
    refused = post(queue, "factory", "factory.run", goal="write me a compiler")
    drain(queue)
    job = queue.get(ok)
    assert job is not None and job.status == "completed" and job.result["objectiveId"] == "run-1"
    assert service.get(sqlite_engine, "run-1").status == "completed"  # type: ignore[union-attr]
    no = queue.get(refused)
    assert no is not None and no.status == "failed" and no.attempt == 1
    assert "built-in planner" in no.error and "RECEIPT_PLANNER_MODULE" in no.error


def test_outbox_redrive_is_single_flight_and_its_timeout_only_observes(
    sqlite_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    queue = Queue(sqlite_engine, control_fast_path=False)
    body = {"title": "t", "goal": "g", "authContext": AUTH, "plan": plan({"A": []})}
    from app.factory.plan import validate_objective

    oid = service.launch(queue, validate_objective(body), launched_by=service.system_launcher()).objective.id
    outbox = registry.OUTBOX_REDRIVE

    def redrive(settings: Settings) -> dict[str, Any]:
        """One pass as the registry runs it: the declared claim policy, in the one wrapper."""
        policy = registry.policy(outbox, settings, datetime.now(UTC))
        return loops.run_claimed(
            sqlite_engine,
            outbox.name,
            policy,
            lambda keep: loops_objectives.outbox_redrive(queue, settings, None, keep),
        ).result

    # Another pass holds the claim: this tick coalesces into it.
    assert loops.claim(sqlite_engine, outbox.name, "other", min_interval_ms=0, ttl_ms=600_000)
    assert redrive(Settings(objective_control_outbox_redrive_timeout_ms=0)) == {"skipped": True}
    loops.release(sqlite_engine, outbox.name, "other")
    with caplog.at_level(logging.WARNING, logger="receipt.loops"):
        out = redrive(
            Settings(
                objective_control_outbox_redrive_timeout_ms=0, objective_control_outbox_redrive_interval_ms=0
            )
        )
    # Past its (zero) deadline the pass still ran to the end and did its work, and said so.
    assert out["controlJobs"] == [f"{oid}:control:2"]
    assert "factory.control_outbox_redrive_slow" in caplog.text


def test_resume_once_is_single_flight(sqlite_engine: Engine) -> None:
    queue = Queue(sqlite_engine, control_fast_path=False)
    settings = Settings(startup_settle_ms=10_000)
    first = loops_objectives.resume_once(queue, settings)
    assert first == {"resumed": 0}
    assert loops_objectives.resume_once(queue, settings) == {"skipped": True}  # spaced: coalesced


def test_control_starts_a_monitor_for_a_computer_task_which_ends_with_its_task(sqlite_engine: Engine) -> None:
    from app.factory.plan import validate_objective
    from app.jobs import timing
    from tests.factory_support import ECHO

    queue = Queue(sqlite_engine)
    body = objective_body(objectiveId="mon-1", plan=plan({"A": [], "B": ["A"]}))
    body["plan"]["tasks"][0]["executionPath"] = "computer"
    service.launch(queue, validate_objective(body, auth_context=AUTH), launched_by=service.system_launcher())
    drain(queue, skip_agents=(ECHO, "factory-monitor"))
    mon = queue.get("mon-1:p1:A:monitor")
    assert mon is not None and mon.agent_id == "factory-monitor" and mon.kind == "factory.task.monitor"
    assert mon.payload["taskJobId"] == "mon-1:p1:A" and mon.payload["executionPath"] == "computer"
    settings = Settings()
    assert timing.lease_ms(mon.agent_id, mon.kind, mon.payload, settings) == max(
        settings.job_lease_ms, settings.codex_job_lease_ms
    )
    assert queue.get("mon-1:p1:B:monitor") is None  # B is local: no monitor
    drain(queue)  # the task job runs first, so the monitor finds it terminal and ends at once
    done = queue.get("mon-1:p1:A:monitor")
    assert done is not None and done.status == "completed"
    assert done.result["outcome"] == "terminal" and done.result["status"] == "completed"
    assert service.get(sqlite_engine, "mon-1").status == "completed"  # type: ignore[union-attr]
