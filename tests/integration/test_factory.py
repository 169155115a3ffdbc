"""Factory objectives over the real store and queue (SQLite and PostgreSQL, same bodies).

Jobs run in-process through the real worker path (``tests.factory_support.drain``), so these
check the receipts, projections and outbox exactly as a deployment writes them.
"""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import context as otel_context
from sqlalchemy import select
from sqlalchemy.engine import Engine

from app import tracing
from app.composition import queue_for
from app.factory import service, storage
from app.factory.plan import validate_objective
from app.factory.vocab import control_job_id, objective_stream, task_job_id
from app.jobs.errors import ConflictError
from app.storage import store
from app.storage.db import objective_tasks, objectives, transaction
from app.storage.queue import Queue
from tests.factory_support import DIAMOND, FAIL, HOLD, drain, plan
from tests.support import queue_ops
from tests.support.queue_ops import lease
from tests.support.tracing import Spans

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone

AUTH = {"userId": "u1", "organizationId": "org-a"}
LAUNCHER = {"tokenId": "tok_test", "scopes": [], "system": False}


def launch(
    queue: Queue, deps: dict[str, list[str]], *, agents: dict[str, str] | None = None, **extra: Any
) -> str:
    body = {"title": "t", "goal": "g", "authContext": AUTH, "plan": plan(deps, agents), **extra}
    return service.launch(queue, validate_objective(body), launched_by=LAUNCHER).objective.id


def types(engine: Engine, objective_id: str) -> list[str]:
    with engine.connect() as conn:
        return [r.type for r in store.read_stream(conn, objective_stream(objective_id))]


def projection_rows(engine: Engine) -> tuple[list[Any], list[Any]]:
    with engine.connect() as conn:
        heads = sorted(
            (r.id, r.status, r.pending_count, r.pending_seq, r.audited, r.last_seq, r.last_hash, r.state)
            for r in conn.execute(select(objectives))
        )
        tasks = sorted(
            (r.objective_id, r.task_id, r.status, r.job_id, r.deps_remaining, r.state)
            for r in conn.execute(select(objective_tasks))
        )
    return heads, tasks


def assert_projection_equals_fold(engine: Engine) -> None:
    before = projection_rows(engine)
    with transaction(engine) as conn:
        storage.rebuild(conn)
    assert projection_rows(engine) == before


def test_diamond_completes_and_d_receives_b_and_c_results(engine: Engine) -> None:
    queue = queue_for(engine)
    oid = launch(queue, DIAMOND)
    # The launch wrote its control request in the same transaction, and the fast path its job.
    assert types(engine, oid) == ["objective.launched", "objective.control_requested"]
    assert queue.get(control_job_id(oid, 2)) is not None
    drain(queue)
    obj = service.get(engine, oid)
    assert obj is not None and obj.status == "completed"
    d = obj.tasks["D"]
    assert d.job_id == task_job_id(oid, 1, "D")
    assert set(d.result["inputs"]) == {"B", "C"}
    assert d.result["inputs"]["B"]["task"] == "B" and d.result["inputs"]["C"]["task"] == "C"
    assert d.result["inputs"]["B"]["inputs"]["A"]["task"] == "A"
    # Each task ran as exactly one job, once.
    for t in DIAMOND:
        job = queue.get(task_job_id(oid, 1, t))
        assert job is not None and job.status == "completed" and job.attempt == 1
        assert job.payload["authContext"] == AUTH and job.payload["taskId"] == t and job.payload["phase"] == 1
    # The terminal audit ran and was appended.
    assert obj.audit is not None
    assert obj.audit["tasksByStatus"] == {"completed": 4}
    assert obj.audit["verified"]["ok"] is True and obj.audit["verified"]["streamsChecked"] == 5
    assert obj.audit["criticalPath"][0] == "A" and obj.audit["criticalPath"][-1] == "D"
    assert types(engine, oid)[-1] == "objective.audited"
    assert obj.launched_by == LAUNCHER
    assert_projection_equals_fold(engine)


def test_a_task_without_a_payload_runs_as_factory_task_run_and_requests_control(engine: Engine) -> None:
    queue = queue_for(engine)
    body = {
        "title": "t",
        "goal": "g",
        "authContext": AUTH,
        "plan": {"tasks": [{"id": "A", "agentId": "test-echo"}]},
    }
    oid = service.launch(queue, validate_objective(body), launched_by=LAUNCHER).objective.id
    drain(queue)
    job = queue.get(task_job_id(oid, 1, "A"))
    assert job is not None and job.kind == "factory.task.run"
    assert service.get(engine, oid).status == "completed"  # type: ignore[union-attr]


def test_a_repeated_control_step_appends_nothing(engine: Engine) -> None:
    queue = queue_for(engine, control_fast_path=False)
    oid = launch(queue, DIAMOND)
    first = service.control_step(queue, oid)
    assert first.enqueued == 1 and first.appended == 2  # consumed + tasks_queued
    seq = service.get(engine, oid).seq  # type: ignore[union-attr]
    again = service.control_step(queue, oid)
    assert again.appended == 0 and again.enqueued == 0
    assert service.get(engine, oid).seq == seq  # type: ignore[union-attr]


def test_fail_fast_stops_everything_and_skips_dependents(engine: Engine) -> None:
    queue = queue_for(engine)
    deps = {"A": [], "B": ["A"], "C": [], "D": ["C"], "E": ["B"]}
    oid = launch(queue, deps, agents={"A": FAIL})
    drain(queue)
    obj = service.get(engine, oid)
    assert obj is not None and obj.status == "failed"
    st = {t: obj.tasks[t].status for t in deps}
    assert st["A"] == "failed" and st["B"] == "skipped" and st["E"] == "skipped"
    assert all(s in ("completed", "failed", "canceled", "skipped") for s in st.values())
    assert obj.failing is not None and obj.failing["taskId"] == "A"
    assert obj.audit is not None and obj.audit["failures"][0]["taskId"] == "A"
    assert "failed on purpose" in obj.audit["failures"][0]["error"]
    assert_projection_equals_fold(engine)


def test_continue_runs_independent_branches_and_ends_failed(engine: Engine) -> None:
    queue = queue_for(engine)
    deps = {"A": [], "B": ["A"], "C": [], "D": ["C"]}
    oid = launch(queue, deps, agents={"A": FAIL}, failurePolicy="continue")
    drain(queue)
    obj = service.get(engine, oid)
    assert obj is not None and obj.status == "failed"
    assert {t: obj.tasks[t].status for t in deps} == {
        "A": "failed",
        "B": "skipped",
        "C": "completed",
        "D": "completed",
    }
    assert_projection_equals_fold(engine)


def test_cancel_mid_flight_aborts_running_tasks_and_never_starts_the_rest(engine: Engine) -> None:
    queue = queue_for(engine)
    oid = launch(queue, {"A": [], "B": [], "C": ["A"]}, agents={"A": HOLD, "B": HOLD})
    drain(queue, skip_agents=(HOLD,))
    a, b = task_job_id(oid, 1, "A"), task_job_id(oid, 1, "B")
    assert lease(queue, a, "w1", 60_000, start=True).applied  # A runs; B still queued
    service.cancel(queue, oid, "changed my mind")
    drain(queue, skip_agents=(HOLD,))
    job_a, job_b = queue.get(a), queue.get(b)
    assert job_b is not None and job_b.status == "canceled"  # queued: canceled outright
    assert job_a is not None and job_a.abort_requested and job_a.status == "running"
    assert service.get(engine, oid).status == "active"  # type: ignore[union-attr]
    # The worker holding A stops it; the objective then ends canceled with nothing running.
    assert queue_ops.settle_canceled(queue, a, "w1", 1, job_a.abort_reason).applied
    drain(queue, skip_agents=(HOLD,))
    obj = service.get(engine, oid)
    assert obj is not None and obj.status == "canceled"
    assert {t: obj.tasks[t].status for t in "ABC"} == {"A": "canceled", "B": "canceled", "C": "canceled"}
    assert queue.get(task_job_id(oid, 1, "C")) is None  # never started
    with pytest.raises(ConflictError):
        service.cancel(queue, oid, "again")
    assert_projection_equals_fold(engine)


def test_the_outbox_request_commits_with_the_task_settlement_and_the_redrive_enqueues_control(
    engine: Engine,
) -> None:
    queue = queue_for(engine, control_fast_path=False)
    oid = launch(queue, {"A": [], "B": ["A"]})
    assert queue.get(control_job_id(oid, 2)) is None  # no fast path: the request waits
    out = service.redrive_outbox(queue)
    assert out["controlJobs"] == [control_job_id(oid, 2)]
    assert service.redrive_outbox(queue)["controlJobs"] == [control_job_id(oid, 2)]  # idempotent
    drain(queue, skip_agents=("test-echo",))
    a = task_job_id(oid, 1, "A")
    assert lease(queue, a, "w1", 60_000, start=True).applied
    before = types(engine, oid)
    assert queue_ops.complete(queue, a, "w1", 1, {"ok": True}).applied
    after = types(engine, oid)
    assert after == [*before, "objective.control_requested"]
    with engine.connect() as conn:
        req = store.read_stream(conn, objective_stream(oid))[-1]
        job_done = store.read_stream(conn, f"jobs/{a}")[-1]
    assert req.body["reason"] == "task_settled" and req.body["jobId"] == a and req.body["taskId"] == "A"
    assert req.id > job_done.id  # written after the settlement's receipt, in its transaction
    for _ in range(10):  # without the fast path, each request waits for a redrive pass
        service.redrive_outbox(queue)
        if not drain(queue):
            break
    obj = service.get(engine, oid)
    assert obj is not None and obj.status == "completed"
    assert_projection_equals_fold(engine)


def test_an_expired_task_lease_requests_control(engine: Engine) -> None:
    queue = queue_for(engine, control_fast_path=False)
    oid = launch(queue, {"A": []})
    service.control_step(queue, oid)
    a = task_job_id(oid, 1, "A")
    assert lease(queue, a, "w1", 1, start=True).applied
    import time

    time.sleep(0.05)
    assert queue.expire_lease(a).applied
    last = types(engine, oid)[-1]
    assert last == "objective.control_requested"
    obj = service.get(engine, oid)
    assert obj is not None and obj.pending[-1].reason == "lease_expired"


def test_resume_writes_one_request_per_active_objective(engine: Engine) -> None:
    queue = queue_for(engine, control_fast_path=False)
    active = [launch(queue, {"A": []}) for _ in range(3)]
    assert service.resume(queue, page_size=2) == 3
    for oid in active:
        obj = service.get(engine, oid)
        assert obj is not None and [r.reason for r in obj.pending] == ["launch", "resume"]


def test_a_job_of_another_organisation_never_requests_control(engine: Engine) -> None:
    from app.jobs.validation import validate_enqueue

    queue = queue_for(engine, control_fast_path=False)
    oid = launch(queue, {"A": []})
    foreign = validate_enqueue(
        "test-echo",
        {
            "payload": {
                "kind": "factory.task.run",
                "objectiveId": oid,
                "taskId": "A",
                "authContext": {"userId": "x", "organizationId": "org-b"},
            }
        },
    )
    job = queue.enqueue(foreign).job
    assert lease(queue, job.id, "w", 60_000, start=True).applied
    before = types(engine, oid)
    assert queue_ops.complete(queue, job.id, "w", 1, {}).applied
    assert types(engine, oid) == before


def test_control_steps_on_one_objective_take_turns(pg_engine: Engine) -> None:
    import threading

    from app.storage.db import session_lock

    queue = queue_for(pg_engine, control_fast_path=False)
    oid = launch(queue, DIAMOND)
    results: list[Any] = []
    with session_lock(pg_engine, f"objective-step:{oid}", wait_s=1) as taken:
        assert taken
        worker = threading.Thread(target=lambda: results.append(service.control_step(queue, oid)))
        worker.start()
        worker.join(0.5)
        assert worker.is_alive() and not results  # waiting for the running step to end
    worker.join(30)
    assert results and results[0].enqueued == 1


def test_an_objective_records_the_launchs_trace_context_and_its_task_jobs_are_its_children(
    spans: Spans, sqlite_engine: Engine
) -> None:
    queue = queue_for(sqlite_engine, control_fast_path=False)
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    token = otel_context.attach(tracing.extract({"traceparent": parent}) or otel_context.Context())
    try:
        oid = launch(queue, {"A": [], "B": []})
    finally:
        otel_context.detach(token)
    obj = service.get(sqlite_engine, oid)
    assert obj is not None and obj.trace_context == {"traceparent": parent}
    # The control step runs in its own job, in another trace; the task jobs still join the objective's.
    assert service.control_step(queue, oid).enqueued == 2
    for task in ("A", "B"):
        job = queue.get(task_job_id(oid, 1, task))
        assert job is not None and job.trace_context == {"traceparent": parent}


def test_an_objective_launched_without_a_context_and_tracing_off_records_none(
    tracing_off: None, sqlite_engine: Engine
) -> None:
    queue = queue_for(sqlite_engine, control_fast_path=False)
    oid = launch(queue, {"A": []})
    with sqlite_engine.connect() as conn:
        launched = store.read_stream(conn, objective_stream(oid))[0]
    assert launched.type == "objective.launched" and "traceContext" not in launched.body
    service.control_step(queue, oid)
    job = queue.get(task_job_id(oid, 1, "A"))
    assert job is not None and job.trace_context is None
