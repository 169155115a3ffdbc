"""Tenancy attacks, end to end: organisation B against organisation A on a real deployment (gunicorn,
driver, workers, beat on PostgreSQL and Redis), with ordinary tokens only.

1. B reads A's objective by posting ``factory.objective.audit`` (or control) naming A's objectiveId.
2. B silences the watchdog by taking the next tick's job id in advance.
3. B probes and pre-claims A's job ids.

The two command attacks (one tenant's command reading another's files, a command reaching the
host's unix sockets) are the sandbox's: ``tests/integration/test_command_isolation.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from app.composition import queue_for
from app.config import Settings
from app.cron import next_after
from app.factory import watchdog
from app.jobs.ids import SYSTEM_ORGANIZATION, qualify
from app.jobs.validation import EnqueueRequest
from app.storage import tokens
from app.storage.db import db_now
from devharness.handlers import TASK
from tests.support.processes import Harness
from tests.support.stack import ORG, Stack, make_stack
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e")]

ORG_B = "e2e-org-b"
TICK_S = 2
ENV = {
    "FACTORY_CONTROL_JOB_LEASE_MS": "6000",
    "RECEIPT_OBJECTIVE_CONTROL_OUTBOX_REDRIVE_INTERVAL_MS": "500",
    "RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_TEST_TICK_S": str(TICK_S),
}


@pytest.fixture(scope="module")
def hostile(module_harness: Harness, module_database_url: str, tmp_path_factory: Any) -> Iterator[Stack]:
    stack = make_stack(module_harness, module_database_url, tmp_path_factory.mktemp("hostile"), **ENV)
    try:
        stack.start("web", "driver", "chat", "control", "beat")
        yield stack
    finally:
        stack.close()
        module_harness.stop_all()


@pytest.fixture(scope="module")
def b_headers(hostile: Stack) -> dict[str, str]:
    _info, secret = tokens.create(hostile.engine, ORG_B)
    return {"Authorization": f"Bearer {secret}"}


def post(stack: Stack, headers: dict[str, str], org: str, agent: str, **body: Any) -> Any:
    payload = body.pop("payload", {})
    body["payload"] = {"authContext": {"userId": "u", "organizationId": org}, **payload}
    return stack.http.post(stack.url(f"/agents/{agent}/jobs"), json=body, headers=headers, timeout=15)


def a_completed_objective(stack: Stack, oid: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "objectiveId": oid,
        "title": "A's secret plan",
        "goal": "A's goal",
        "plan": {"tasks": [{"id": "secret-task", "agentId": TASK, "payload": {"kind": "factory.task.run"}}]},
    }
    r = stack.http.post(stack.url("/objectives"), json=body, headers=stack.headers(), timeout=30)
    assert r.status_code == 202, r.text

    def audited() -> dict[str, Any] | None:
        got = stack.http.get(stack.url(f"/objectives/{oid}"), headers=stack.headers(), timeout=15).json()
        return got["objective"] if got["objective"]["audit"] else None

    return wait_for(audited, 60, interval=0.2, what=f"A's objective {oid} to end and be audited")


def test_b_cannot_read_or_drive_as_objective(hostile: Stack, b_headers: dict[str, str]) -> None:
    obj = a_completed_objective(hostile, "a-secret")
    assert obj["status"] == "completed"
    # At the door: B's post naming A's objective is the same 403 as one naming no objective at all.
    answers = {}
    for kind in ("factory.objective.audit", "factory.objective.control"):
        for oid in ("a-secret", "never-launched"):
            r = post(hostile, b_headers, ORG_B, "factory-control", payload={"kind": kind, "objectiveId": oid})
            answers[(kind, oid)] = (r.status_code, r.content)
        assert answers[(kind, "a-secret")] == answers[(kind, "never-launched")]
        assert answers[(kind, "a-secret")][0] == 403
    # Behind the door (a job written by any other path): the real control worker refuses it exactly
    # as it refuses a missing objective, and its result carries nothing of A's.
    queue = queue_for(hostile.engine)
    failed = {}
    for oid in ("a-secret", "never-launched"):
        payload = {
            "kind": "factory.objective.audit",
            "objectiveId": oid,
            "authContext": {"userId": "u", "organizationId": ORG_B},
        }
        job = queue.enqueue(EnqueueRequest(agent_id="factory-control", payload=payload)).job
        hostile.wait_terminal(job.id)
        failed[oid] = queue.get(job.id)
    for oid, settled in failed.items():
        assert settled is not None and settled.status == "failed" and settled.attempt == 1  # not retried
        assert settled.error == f"no objective {oid!r} in this job's organisation"
        assert settled.result == {"status": "failed"}  # a non-retryable failure's status, nothing else
    text = repr(failed["a-secret"].to_json())  # type: ignore[union-attr]
    assert "secret-task" not in text and "A's goal" not in text


def test_b_cannot_silence_the_watchdog(hostile: Stack, b_headers: dict[str, str]) -> None:
    expr = watchdog.cron_expression(Settings(objective_watchdog_test_tick_s=TICK_S))
    with hostile.engine.connect() as conn:
        now = db_now(conn)
    upcoming = [next_after(expr, now + timedelta(seconds=TICK_S * i)) for i in range(1, 4)]
    # At the door: the tick's id is a reserved shape, even in B's own organisation.
    for tick in upcoming:
        r = post(
            hostile,
            b_headers,
            ORG_B,
            "factory",
            jobId=watchdog.tick_job_id(tick),
            payload={"kind": "factory.run"},
        )
        assert r.status_code == 400 and r.json()["error"]["details"]["field"] == "jobId"
    # Behind the door: even a job B holds under that exact id is B's, not the system's tick.
    queue = queue_for(hostile.engine)
    payload = {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": ORG_B}}
    for tick in upcoming:
        squat = EnqueueRequest(
            agent_id="nobody", payload=payload, key=qualify(ORG_B, watchdog.tick_job_id(tick))
        )
        assert queue.enqueue(squat).created
    # Beat enqueues each of those ticks in the system organisation, and the watchdog pass runs.
    for tick in upcoming:
        key = qualify(SYSTEM_ORGANIZATION, watchdog.tick_job_id(tick))
        ran = hostile.wait_status(key, "completed", timeout=30)
        assert ran.kind == "factory.objective.watchdog" and ran.organization_id == SYSTEM_ORGANIZATION
        assert set(ran.result) >= {"scanned", "reconciled"}


def test_job_ids_are_one_namespace_per_organisation(hostile: Stack, b_headers: dict[str, str]) -> None:
    a_job = hostile.post_job("e2e-echo", job_id="shared-id", message="A's")
    r = post(hostile, b_headers, ORG_B, "e2e-echo", jobId="shared-id", payload={"kind": "factory.run"})
    assert r.status_code == 202, r.text  # B's own job: nothing says A holds the id
    b_job = r.json()["job"]
    assert b_job["id"] == a_job["id"] == "shared-id"
    assert b_job["organizationId"] == ORG_B and a_job["organizationId"] == ORG
    assert b_job["stream"] != a_job["stream"]
    hostile.wait_terminal(a_job["stream"].removeprefix("jobs/"))
    hostile.wait_terminal(b_job["stream"].removeprefix("jobs/"))
    # B reads only its own; A's own job is untouched by B's post.
    got = hostile.http.get(hostile.url("/jobs/shared-id"), headers=b_headers, timeout=10).json()["job"]
    assert got["stream"] == b_job["stream"]
    mine = hostile.get_job("shared-id")
    assert mine["stream"] == a_job["stream"] and mine["result"]["echo"] == "A's"
    # An id only A holds answers B exactly like an id nobody holds.
    hostile.post_job("e2e-echo", job_id="only-a")
    known = hostile.http.get(hostile.url("/jobs/only-a"), headers=b_headers, timeout=10)
    unknown = hostile.http.get(hostile.url("/jobs/nobody-holds-this"), headers=b_headers, timeout=10)
    assert known.status_code == unknown.status_code == 404 and known.content == unknown.content
