"""The objective reducer's ``objective.replanned`` rules (phases)."""

from __future__ import annotations

from typing import Any

from app.factory.control import decide
from app.factory.reducer import Objective, fold
from app.factory.vocab import PHASE_SUPERSEDED
from app.jobs.reducer import Receipt
from tests.unit.test_factory_core import launched, r


def phase2(seq: int, *ids: str, phase: int = 2) -> Receipt:
    tasks: list[dict[str, Any]] = [{"id": t, "agentId": "codex", "kind": "factory.task.run"} for t in ids]
    return r(seq, "objective.replanned", {"phase": phase, "reason": "x", "tasks": tasks})


def objective(*more: Receipt) -> Objective:
    obj = fold([*launched(), *more])
    assert obj is not None
    return obj


def test_replan_starts_phase_n_plus_1_and_cancels_what_never_started() -> None:
    queued = r(2, "objective.tasks_queued", {"tasks": [{"taskId": "a", "jobId": "o1:p1:a"}]})
    obj = objective(queued, phase2(3, "c", "d"))
    assert obj.phase == 2 and obj.task_order == ("c", "d") and obj.counts == {"pending": 2}
    assert (obj.tasks["a"].phase, obj.tasks["a"].status) == (1, "queued")  # its job is control's to stop
    assert (obj.tasks["b"].status, obj.tasks["b"].error) == ("canceled", PHASE_SUPERSEDED)
    assert obj.tasks["c"].phase == 2 and obj.tasks["c"].status == "pending"


def test_a_superseded_settlement_is_recorded_outside_the_current_counts() -> None:
    queued = r(2, "objective.tasks_queued", {"tasks": [{"taskId": "a", "jobId": "o1:p1:a"}]})
    settled = r(4, "objective.task_settled", {"taskId": "a", "jobId": "o1:p1:a", "status": "canceled"})
    obj = objective(queued, phase2(3, "c"), settled)
    assert obj.tasks["a"].status == "canceled" and obj.counts == {"pending": 1}


def test_replan_is_ignored_when_terminal_out_of_order_or_reusing_an_id() -> None:
    assert objective(phase2(2, "c", phase=3)).phase == 1
    assert objective(phase2(2, "a")).phase == 1
    ended = objective(r(2, "objective.canceled", {"reason": "x"}), phase2(3, "c"))
    assert ended.phase == 1 and "c" not in ended.tasks


def test_control_stops_an_earlier_phase_job_and_waits_for_it_before_ending() -> None:
    from tests.unit.test_watchdog import job

    queued = r(2, "objective.tasks_queued", {"tasks": [{"taskId": "a", "jobId": "o1:p1:a"}]})
    obj = objective(queued, phase2(3, "c"))
    running = job("o1:p1:a", status="running", objectiveId="o1", taskId="a")
    d = decide(obj, {"o1:p1:a": running})
    assert [(c.job_id, c.reason) for c in d.cancel] == [("o1:p1:a", "phase superseded")]
    assert d.enqueue == ["c"] and d.ended is None
