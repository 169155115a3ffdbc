"""The objective event stream's pure parts: the server's deltas and the client applying them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from api.objective_view import ObjectiveView, objective_json
from app.factory.reducer import Objective, fold, reduce
from app.jobs.reducer import Job, Receipt
from receipt.client import apply_objective_event
from tests.unit.test_factory_core import launched, r


def _job(status: str, attempt: int = 1) -> Job:
    return cast(Job, SimpleNamespace(status=status, attempt=attempt))


def _run(
    obj: Objective, receipts: list[Receipt], view: ObjectiveView, jobs: Any = None
) -> list[dict[str, Any]]:
    out = []
    for receipt in receipts:
        after = reduce(obj, receipt)
        assert after is not None
        out.append(view.after_receipt(obj, after, receipt.type, jobs or {}))
        obj = after
    return out


def _start() -> tuple[Objective, ObjectiveView, dict[str, Any]]:
    obj = fold(launched())
    assert obj is not None
    view = ObjectiveView()
    return obj, view, view.snapshot(obj, {})


def test_a_delta_carries_only_the_tasks_that_changed_and_the_status_only_when_it_changes() -> None:
    obj, view, snapshot = _start()
    assert snapshot == objective_json(obj)
    deltas = _run(
        obj,
        [
            r(2, "objective.control_requested", {"requestId": "q1", "reason": "launch"}),
            r(3, "objective.tasks_queued", {"tasks": [{"taskId": "a", "jobId": "o1:p1:a"}]}),
            # Settling a also moves b's remaining dependencies, which GET does not show.
            r(4, "objective.task_settled", {"taskId": "a", "jobId": "o1:p1:a", "status": "completed"}),
        ],
        view,
    )
    assert [(d["seq"], d["type"]) for d in deltas] == [
        (2, "objective.control_requested"),
        (3, "objective.tasks_queued"),
        (4, "objective.task_settled"),
    ]
    assert deltas[0]["tasks"] == []
    assert [(t["id"], t["status"], t["jobId"]) for t in deltas[1]["tasks"]] == [("a", "queued", "o1:p1:a")]
    assert [(t["id"], t["status"]) for t in deltas[2]["tasks"]] == [("a", "completed")]
    assert all("status" not in d and "phase" not in d and "audit" not in d for d in deltas)


def test_the_end_and_the_audit_each_appear_once() -> None:
    obj, view, _ = _start()
    deltas = _run(
        obj,
        [r(2, "objective.canceled", {"reason": "x"}), r(3, "objective.audited", {"report": {"ok": True}})],
        view,
    )
    assert deltas[0]["status"] == "canceled" and "audit" not in deltas[0]
    assert deltas[1]["audit"] == {"ok": True} and "status" not in deltas[1]


def test_the_overlay_sends_a_task_when_its_job_starts_and_once_only() -> None:
    obj, view, _ = _start()
    queued = reduce(obj, r(2, "objective.tasks_queued", {"tasks": [{"taskId": "a", "jobId": "o1:p1:a"}]}))
    assert queued is not None
    view.after_receipt(obj, queued, "objective.tasks_queued", {})
    assert view.overlay(queued, ["a"], {"o1:p1:a": _job("queued", 0)}) == []  # still queued: nothing
    running = view.overlay(queued, ["a"], {"o1:p1:a": _job("running")})
    assert [(t["id"], t["status"], t["attempt"]) for t in running] == [("a", "running", 1)]
    assert view.overlay(queued, ["a"], {"o1:p1:a": _job("running")}) == []  # already sent
    # A retry puts the job back in the queue: the task is shown queued again, with its attempt.
    back = view.overlay(queued, ["a"], {"o1:p1:a": _job("queued", 1)})
    assert [(t["status"], t["attempt"]) for t in back] == [("queued", 1)]


def test_the_client_applying_every_event_has_what_get_shows() -> None:
    obj, view, snapshot = _start()
    receipts = [
        r(2, "objective.tasks_queued", {"tasks": [{"taskId": "a", "jobId": "o1:p1:a"}]}),
        r(
            3,
            "objective.task_settled",
            {"taskId": "a", "jobId": "o1:p1:a", "status": "completed", "result": 1},
        ),
        r(4, "objective.tasks_queued", {"tasks": [{"taskId": "b", "jobId": "o1:p1:b"}]}),
        r(5, "objective.task_settled", {"taskId": "b", "jobId": "o1:p1:b", "status": "failed"}),
        r(6, "objective.failed", {"reason": "b failed"}),
        r(7, "objective.audited", {"report": {"tasks": 2}}),
    ]
    events: list[tuple[str, dict[str, Any]]] = [("objective", snapshot)]
    state = obj
    for receipt in receipts:
        after = reduce(state, receipt)
        assert after is not None
        events.append(("delta", view.after_receipt(state, after, receipt.type, {})))
        state = after
    client: dict[str, Any] | None = None
    assert apply_objective_event(None, "delta", events[1][1]) is None  # nothing to apply it to
    for name, data in events:
        client = apply_objective_event(client, name, data)
    expected = objective_json(state)
    assert client is not None
    assert {k: v for k, v in client.items() if k != "updatedAt"} == {
        k: v for k, v in expected.items() if k != "updatedAt"
    }
    assert client["updatedAt"] == expected["updatedAt"]
    assert client["status"] == "failed" and client["audit"] == {"tasks": 2}
