"""The factory handlers (dispatch, run + planner, the not-yet-built ones) and the Factory loop_claims."""

from __future__ import annotations

import http.server
import json
import logging
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.config import Settings
from app.factory import recovery, service
from app.factory.plan import validate_objective
from app.factory.vocab import objective_stream
from app.jobs.ids import qualify
from app.jobs.reducer import Job
from app.jobs.validation import validate_enqueue
from app.ops import loop_registry
from app.storage import loop_claims, store
from app.storage.queue import Queue
from tests.factory_support import DIAMOND, drain, plan, registry
from workers.runner import run_attempt

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone

AUTH = {"userId": "u1", "organizationId": "org-a"}


def post(queue: Queue, agent: str, kind: str, **payload: Any) -> str:
    body: dict[str, Any] = {"payload": {"kind": kind, **payload}}
    if kind != "factory.objective.watchdog":
        body["payload"]["authContext"] = AUTH
    return queue.enqueue(validate_enqueue(agent, body)).job.id


def objective_body(**extra: Any) -> dict[str, Any]:
    return {"objectiveId": "disp-1", "title": "t", "goal": "g", "plan": plan(DIAMOND), **extra}


def test_factory_dispatch_launches_once_by_objective_id(sqlite_engine: Engine) -> None:
    queue = queue_for(sqlite_engine)
    first = post(queue, "factory", "factory.dispatch", objective=objective_body())
    second = post(queue, "factory", "factory.dispatch", objective=objective_body(title="again"))
    drain(queue)
    a, b = queue.get(first), queue.get(second)
    assert a is not None and a.status == "completed" and a.result["created"] is True
    assert b is not None and b.status == "completed" and b.result["created"] is False
    assert a.result["objectiveId"] == "disp-1" and a.result["stream"] == "objectives/org-a/disp-1"
    obj = service.find(sqlite_engine, "org-a", "disp-1")
    assert obj is not None and obj.status == "completed" and obj.title == "t"
    assert obj.id == qualify("org-a", "disp-1") and service.get(sqlite_engine, obj.id) == obj
    # The dispatch job was enqueued with no recorded enqueuer: the objective it launched holds no
    # rights (a launch never acts with more rights than whoever asked for it).
    assert obj.launched_by == {"tokenId": None, "scopes": [], "system": False}


def test_factory_dispatch_refuses_a_bad_objective_without_retrying(sqlite_engine: Engine) -> None:
    queue = queue_for(sqlite_engine)
    job_id = post(queue, "factory", "factory.dispatch", objective=objective_body(plan={"tasks": []}))
    drain(queue)
    job = queue.get(job_id)
    assert job is not None and job.status == "failed" and job.attempt == 1
    assert "plan.tasks" in job.error and "empty" in job.error


def test_factory_run_launches_an_explicit_plan_and_refuses_a_written_goal(sqlite_engine: Engine) -> None:
    queue = queue_for(sqlite_engine)
    ok = post(
        queue, "factory", "factory.run", goal={"text": "do it", "plan": plan({"A": []})}, objectiveId="run-1"
    )
    refused = post(queue, "factory", "factory.run", goal="write me a compiler")
    drain(queue)
    job = queue.get(ok)
    assert job is not None and job.status == "completed" and job.result["objectiveId"] == "run-1"
    assert service.get(sqlite_engine, qualify("org-a", "run-1")).status == "completed"  # type: ignore[union-attr]
    no = queue.get(refused)
    assert no is not None and no.status == "failed" and no.attempt == 1
    assert "built-in planner" in no.error and "RECEIPT_PLANNER_MODULE" in no.error


def test_outbox_redrive_is_single_flight_and_its_timeout_only_observes(
    sqlite_engine: Engine, caplog: pytest.LogCaptureFixture
) -> None:
    queue = queue_for(sqlite_engine, control_fast_path=False)
    body = {"title": "t", "goal": "g", "authContext": AUTH, "plan": plan({"A": []})}
    from app.factory.plan import validate_objective

    oid = service.launch(queue, validate_objective(body), launched_by=service.system_launcher()).objective.id
    outbox = loop_registry.OUTBOX_REDRIVE

    def redrive(settings: Settings) -> dict[str, Any]:
        """One pass as the registry runs it: the declared claim policy, in the one wrapper."""
        policy = loop_registry.policy(outbox, settings, datetime.now(UTC))
        return loop_claims.run_claimed(
            sqlite_engine,
            outbox.name,
            policy,
            lambda keep: recovery.outbox_redrive(queue, settings, None, keep),
        ).result

    # Another pass holds the claim: this tick coalesces into it.
    assert loop_claims.claim(sqlite_engine, outbox.name, "other", min_interval_ms=0, ttl_ms=600_000)
    assert redrive(Settings(objective_control_outbox_redrive_timeout_ms=0)) == {"skipped": True}
    loop_claims.release(sqlite_engine, outbox.name, "other")
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
    queue = queue_for(sqlite_engine, control_fast_path=False)
    settings = Settings(startup_settle_ms=10_000)
    first = recovery.resume_once(queue, settings)
    assert first == {"resumed": 0}
    assert recovery.resume_once(queue, settings) == {"skipped": True}  # spaced: coalesced


def test_control_starts_a_monitor_for_a_computer_task_which_ends_with_its_task(sqlite_engine: Engine) -> None:
    from app.factory.plan import validate_objective
    from app.jobs import timing
    from tests.factory_support import ECHO

    queue = queue_for(sqlite_engine)
    body = objective_body(objectiveId="mon-1", plan=plan({"A": [], "B": ["A"]}))
    body["plan"]["tasks"][0]["executionPath"] = "computer"
    service.launch(queue, validate_objective(body, auth_context=AUTH), launched_by=service.system_launcher())
    drain(queue, skip_agents=(ECHO, "factory-monitor"))
    mon = queue.get("org-a/mon-1:p1:A:monitor")
    assert mon is not None and mon.agent_id == "factory-monitor" and mon.kind == "factory.task.monitor"
    # The payload names the task's job and the objective as their organisation knows them.
    assert mon.payload["taskJobId"] == "mon-1:p1:A" and mon.payload["executionPath"] == "computer"
    assert mon.payload["objectiveId"] == "mon-1" and mon.organization_id == "org-a"
    settings = Settings()
    assert timing.lease_ms(mon.agent_id, mon.kind, mon.payload, settings) == max(
        settings.job_lease_ms, settings.codex_job_lease_ms
    )
    assert queue.get("org-a/mon-1:p1:B:monitor") is None  # B is local: no monitor
    drain(queue)  # the task job runs first, so the monitor finds it terminal and ends at once
    done = queue.get("org-a/mon-1:p1:A:monitor")
    assert done is not None and done.status == "completed"
    assert done.result["outcome"] == "terminal" and done.result["status"] == "completed"
    # The result names the task's job as the monitor's payload does: by its organisation's id for it.
    assert done.result["taskJobId"] == "mon-1:p1:A"
    assert service.get(sqlite_engine, "org-a/mon-1").status == "completed"  # type: ignore[union-attr]


# -- owner checks: a job names an objective of its own organisation only --------------------------

AUTH_B = {"userId": "u2", "organizationId": "org-b"}
SHARED = "shared-obj"
# Each kind that names an objective, on the agent that runs it, with the rest of its payload. The
# monitor names the task job A's objective would derive, so it too names something A holds.
OWNER_CHECKED: dict[str, tuple[str, dict[str, Any]]] = {
    "factory.objective.audit": ("factory-control", {}),
    "factory.objective.control": ("factory-control", {"reason": "task_settled"}),
    "factory.task.monitor": (
        "factory-monitor",
        {"taskId": "A", "phase": 1, "taskJobId": f"{SHARED}:p1:A", "executionPath": "computer"},
    ),
    "factory.integration.publish": ("codex", {}),
}


class _Recorder(http.server.BaseHTTPRequestHandler):
    """A publish target that records every request it gets (the owner check must send none)."""

    received: list[bytes] = []

    def do_POST(self) -> None:
        type(self).received.append(self.rfile.read(int(self.headers.get("content-length", "0"))))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *_: Any) -> None:
        pass


@pytest.fixture
def publish_target() -> Iterator[str]:
    _Recorder.received = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/publish"
    server.shutdown()
    server.server_close()
    thread.join(5)


def _run_b_job(queue: Queue, settings: Settings, kind: str) -> Job:
    """Org B's job of ``kind`` naming ``SHARED``, written straight through the queue (no API door:
    no privilege check ran), then one attempt of it through the real worker path."""
    agent, extra = OWNER_CHECKED[kind]
    payload = {"kind": kind, "objectiveId": SHARED, "authContext": AUTH_B, **extra}
    job = queue.enqueue(validate_enqueue(agent, {"payload": payload, "maxAttempts": 3})).job
    assert job.organization_id == "org-b"
    reg = registry()
    run_attempt(queue, settings, reg, job.id, 1)
    done = queue.get(job.id)
    assert done is not None
    return done


def _objective_receipts(engine: Engine, key: str) -> list[tuple[int, str, str]]:
    with engine.connect() as conn:
        return [(r.seq, r.type, r.hash) for r in store.read_stream(conn, objective_stream(key))]


@pytest.mark.parametrize("kind", sorted(OWNER_CHECKED))
def test_a_job_naming_another_organisations_objective_fails_exactly_as_for_a_missing_one(
    engine: Engine, publish_target: str, kind: str
) -> None:
    queue = queue_for(engine)
    settings = Settings(
        retry_backoff_ms=0,
        integration_publish_url=publish_target,
        integration_publish_secret="whsec_" + "c2VjcmV0LWZvci10ZXN0cw==",
    )
    # Before any organisation holds SHARED: what B's job gets for a missing objective.
    missing = _run_b_job(queue, settings, kind)
    # A failure's result is only its status (the reducer's rule): no data of any objective.
    assert missing.status == "failed" and missing.attempt == 1 and missing.result == {"status": "failed"}
    assert missing.error == f"no objective {SHARED!r} in this job's organisation"

    # Org A launches SHARED (a computer-path task, so A holds a monitor of that task job too).
    a_plan = plan({"A": []})
    a_plan["tasks"][0]["executionPath"] = "computer"
    body = {"objectiveId": SHARED, "title": "A's secret title", "goal": "A's goal", "plan": a_plan}
    a_obj = service.launch(
        queue, validate_objective(body, auth_context=AUTH), launched_by=service.system_launcher()
    )
    drain(queue)
    a_key = a_obj.objective.id
    assert a_key == qualify("org-a", SHARED)
    before = service.get(engine, a_key)
    assert before is not None and before.status == "completed" and before.audit is not None
    a_task_job = queue.find("org-a", f"{SHARED}:p1:A")
    assert a_task_job is not None and a_task_job.status == "completed"
    a_receipts = _objective_receipts(engine, a_key)

    foreign = _run_b_job(queue, settings, kind)
    # The same refusal, word for word, and never retried (3 attempts were allowed).
    assert (foreign.status, foreign.attempt, foreign.error) == ("failed", 1, missing.error)
    assert foreign.max_attempts == 3
    # Nothing of A's objective reached B: no result, no progress report, nothing published.
    assert foreign.result == missing.result == {"status": "failed"}
    with engine.connect() as conn:
        b_types = [r.type for r in store.read_stream(conn, foreign.stream)]
    assert "job.progress" not in b_types and b_types[-1] == "job.failed"
    assert "A's" not in json.dumps(foreign.to_json()) and "org-a" not in json.dumps(foreign.to_json())
    assert _Recorder.received == []
    # And B's job did nothing to A's objective: not one receipt more, the same state.
    assert _objective_receipts(engine, a_key) == a_receipts
    assert service.get(engine, a_key) == before
    assert queue.find("org-b", SHARED) is None and service.find(engine, "org-b", SHARED) is None
