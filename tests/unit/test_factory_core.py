"""The Factory's pure core: plan checks, the objective reducer's invariants, the outbox rule."""

from __future__ import annotations

from typing import Any

import pytest

from app.factory.outbox import control_request_for
from app.factory.plan import find_cycle, validate_objective
from app.factory.reducer import fold, reduce
from app.factory.vocab import MAX_PLAN_TASKS, no_objective_message, task_job_id
from app.jobs.errors import InvariantError, ValidationError
from app.jobs.reducer import Job, Receipt
from app.jobs.vocab import Status
from tests.unit.factory_sim import AUTH, World, plan_body


def r(seq: int, type_: str, body: dict[str, Any], stream: str = "objectives/o1") -> Receipt:
    return Receipt(stream, seq, type_, body, at=f"2026-01-01T00:00:{seq:02d}.000000Z")


def launched() -> list[Receipt]:
    spec = validate_objective(plan_body({"a": [], "b": ["a"]}), auth_context=AUTH)
    body = {
        "objectiveId": "o1",
        "title": "t",
        "goal": "g",
        "failurePolicy": "failFast",
        "authContext": AUTH,
        "launchedBy": None,
        "phase": 1,
        "tasks": [t.to_json() for t in spec.tasks],
    }
    return [r(1, "objective.launched", body)]


def test_an_event_for_a_missing_objective_raises_the_invariant() -> None:
    with pytest.raises(InvariantError) as exc:
        reduce(None, r(1, "objective.tasks_queued", {"tasks": []}, stream="objectives/ghost"))
    assert str(exc.value) == no_objective_message("ghost") == "Invariant: no objective for ghost"


def test_a_control_request_for_a_missing_objective_is_ignored() -> None:
    assert reduce(None, r(1, "objective.control_requested", {"requestId": "x", "reason": "resume"})) is None


def test_only_the_tasks_own_job_settles_it_and_only_while_queued() -> None:
    obj = fold(
        [*launched(), r(2, "objective.tasks_queued", {"tasks": [{"taskId": "a", "jobId": "o1:p1:a"}]})]
    )
    assert obj is not None and obj.tasks["a"].status == "queued" and obj.tasks["b"].deps_remaining == 1
    foreign = reduce(
        obj, r(3, "objective.task_settled", {"taskId": "a", "jobId": "other", "status": "completed"})
    )
    assert foreign is not None and foreign.tasks["a"].status == "queued" and foreign.seq == 3
    done = reduce(
        obj,
        r(
            3,
            "objective.task_settled",
            {"taskId": "a", "jobId": "o1:p1:a", "status": "completed", "result": {"x": 1}},
        ),
    )
    assert done is not None and done.tasks["a"].status == "completed" and done.tasks["b"].deps_remaining == 0
    assert done.counts == {"completed": 1, "pending": 1}
    twice = reduce(
        done, r(4, "objective.task_settled", {"taskId": "a", "jobId": "o1:p1:a", "status": "failed"})
    )
    assert twice is not None and twice.tasks["a"].status == "completed"


def test_a_terminal_objective_absorbs_task_events_but_takes_its_audit() -> None:
    obj = fold([*launched(), r(2, "objective.canceled", {"reason": "x"})])
    assert obj is not None and obj.status == "canceled"
    after = fold(
        [
            r(3, "objective.tasks_queued", {"tasks": [{"taskId": "a", "jobId": "j"}]}),
            r(4, "objective.audited", {"report": {"ok": True}}),
        ],
        obj,
    )
    assert after is not None and after.tasks["a"].status == "pending" and after.audit == {"ok": True}


def test_a_second_launch_is_inert() -> None:
    obj = fold(
        [*launched(), r(2, "objective.launched", {"objectiveId": "o1", "title": "other", "tasks": []})]
    )
    assert obj is not None and obj.title == "t" and len(obj.tasks) == 2


def test_find_cycle_names_the_cycle_in_order() -> None:
    spec = plan_body({"a": [], "b": ["a"]})
    tasks = validate_objective(spec).tasks
    assert find_cycle(tasks) is None
    body = {
        "title": "t",
        "goal": "g",
        "authContext": AUTH,
        "plan": {
            "tasks": [
                {"id": "x", "dependsOn": ["z"]},
                {"id": "y", "dependsOn": ["x"]},
                {"id": "z", "dependsOn": ["y"]},
                {"id": "w", "dependsOn": ["x"]},
            ]
        },
    }
    with pytest.raises(ValidationError) as exc:
        validate_objective(body)
    assert exc.value.field == "plan.tasks" and "x -> z -> y -> x" in exc.value.message


def test_a_thousand_task_chain_validates_without_recursion() -> None:
    tasks = [{"id": f"t{i}", "dependsOn": [f"t{i - 1}"] if i else []} for i in range(MAX_PLAN_TASKS)]
    spec = validate_objective({"title": "t", "goal": "g", "authContext": AUTH, "plan": {"tasks": tasks}})
    assert len(spec.tasks) == MAX_PLAN_TASKS and spec.tasks[0].kind == "factory.task.run"
    assert spec.tasks[0].agent_id == "codex"


def _job(kind: str, status: Status, **payload: Any) -> Job:
    return Job(
        "j1", "codex", "collect", {"kind": kind, **payload}, None, "allow", 2, "org", status=status, seq=5
    )


def test_the_outbox_rule_reads_the_contract_flag() -> None:
    queued = _job("factory.task.run", "running", objectiveId="o1", taskId="a")
    done = _job("factory.task.run", "completed", objectiveId="o1", taskId="a")
    body = control_request_for(queued, done, ["job.completed"])
    assert body is not None and body["reason"] == "task_settled" and body["taskId"] == "a"
    assert control_request_for(done, done, ["job.completed"]) is None  # already terminal
    # factory.objective.control has no reconcile flag: its own end never requests control.
    ctl = _job("factory.objective.control", "completed", objectiveId="o1")
    assert (
        control_request_for(_job("factory.objective.control", "running", objectiveId="o1"), ctl, []) is None
    )
    assert control_request_for(queued, _job("factory.task.run", "completed"), ["job.completed"]) is None


def test_deterministic_task_job_ids() -> None:
    assert task_job_id("obj", 1, "a") == "obj:p1:a"
    world = World.launch({"a": []}, {"a": "ok"}, "failFast")
    world.step()
    world.step()
    assert world.created == {"obj:p1:a": 1}


def test_docs_list_every_objective_receipt_type_and_control_reason() -> None:
    from pathlib import Path

    from app.factory.reducer import _HANDLERS
    from app.factory.vocab import CONTROL_REASONS, OBJECTIVE_EVENT_TYPES

    doc = (Path(__file__).resolve().parents[2] / "docs" / "factory.md").read_text()
    assert set(_HANDLERS) == set(OBJECTIVE_EVENT_TYPES)
    for type_ in OBJECTIVE_EVENT_TYPES:
        assert f"`{type_}`" in doc, type_
    for reason in CONTROL_REASONS:
        assert reason in doc, reason
