"""Phases and replanning on a real database (SQLite and Postgres), through the real worker path."""

from __future__ import annotations

from typing import Any

import pytest

from app.factory import service, storage
from app.factory.plan import validate_objective
from app.factory.reducer import fold
from app.factory.vocab import objective_stream, task_job_id
from app.jobs.errors import ConflictError, ValidationError
from app.jobs.ids import qualify
from app.storage import store
from app.storage.db import transaction
from app.storage.queue import Queue
from tests.factory_support import ECHO, drain, plan
from tests.support.queue_ops import lease, settle_canceled

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone

AUTH = {"userId": "u1", "organizationId": "org-a"}


def launch(queue: Queue, oid: str, deps: dict[str, list[str]]) -> str:
    """Launch org-a's objective ``oid``; returns its key (what storage and the service take)."""
    body = {"objectiveId": oid, "title": "t", "goal": "g", "plan": plan(deps)}
    obj = service.launch(
        queue, validate_objective(body, auth_context=AUTH), launched_by=service.system_launcher()
    ).objective
    assert obj.id == qualify("org-a", oid) and obj.client_id == oid
    return obj.id


def tasks(*ids: str, deps: dict[str, list[str]] | None = None) -> list[dict[str, Any]]:
    deps = deps or {}
    return [{"id": t, "agentId": ECHO, "dependsOn": deps.get(t, [])} for t in ids]


def statuses(queue: Queue, oid: str) -> dict[str, tuple[int, str]]:
    obj = service.get(queue.engine, oid)
    assert obj is not None
    return {t.id: (t.phase, t.status) for t in obj.tasks.values()}


def test_replan_cancels_the_earlier_phase_and_completes_the_new_one(queue: Queue) -> None:
    oid = launch(queue, "rp-1", {"A": [], "B": ["A"]})
    drain(queue, skip_agents=(ECHO,))  # control ran: A's job is queued, B pending
    a_job = task_job_id(oid, 1, "A")
    assert a_job == "org-a/rp-1:p1:A"
    queued = queue.get(a_job)
    assert queued is not None and queued.status == "queued"
    assert queued.payload["objectiveId"] == "rp-1"  # the payload names it as its organisation does
    obj = service.replan(queue, oid, tasks("C", "D", deps={"D": ["C"]}), "new approach")
    assert obj.phase == 2 and obj.task_order == ("C", "D")
    drain(queue, skip_agents=(ECHO,))  # control stops phase 1 before any task job runs
    assert queue.get(a_job).status == "canceled"  # type: ignore[union-attr]
    drain(queue)
    final = service.get(queue.engine, oid)
    assert final is not None and final.status == "completed" and final.phase == 2
    assert statuses(queue, oid) == {
        "A": (1, "canceled"),
        "B": (1, "canceled"),
        "C": (2, "completed"),
        "D": (2, "completed"),
    }
    a = queue.get(a_job)
    assert a is not None and a.status == "canceled"
    # D got C's result: the new phase is a graph like any other; its jobs are named by phase 2.
    d = queue.get(task_job_id(oid, 2, "D"))
    assert d is not None and d.result["inputs"]["C"]["task"] == "C"


def test_a_running_earlier_job_gets_an_abort_with_reason_phase_superseded(queue: Queue) -> None:
    oid = launch(queue, "rp-2", {"A": []})
    drain(queue, skip_agents=(ECHO,))
    a_job = task_job_id(oid, 1, "A")
    lease(queue, a_job, "w-test", 60_000, start=True)
    service.replan(queue, oid, tasks("C"), None)
    drain(queue, skip_agents=(ECHO,))
    a = queue.get(a_job)
    assert a is not None and a.status in ("leased", "running") and a.abort_requested
    assert a.abort_reason == "phase superseded"
    mid = service.get(queue.engine, oid)
    assert mid is not None and mid.status == "active"  # C is queued, A still stopping
    drain(queue)  # C completes; A's worker is "gone": the objective waits for A to stop
    assert service.get(queue.engine, oid).status == "active"  # type: ignore[union-attr]
    settle_canceled(queue, a_job, "w-test", 1, "phase superseded")
    drain(queue)
    final = service.get(queue.engine, oid)
    assert final is not None and final.status == "completed"
    assert statuses(queue, oid) == {"A": (1, "canceled"), "C": (2, "completed")}


def test_replan_refuses_a_terminal_objective_and_bad_plans(queue: Queue) -> None:
    oid = launch(queue, "rp-3", {"A": []})
    with pytest.raises(ValidationError) as bad:
        service.replan(queue, oid, [], None)
    assert bad.value.field == "tasks"
    with pytest.raises(ValidationError) as reused:
        service.replan(queue, oid, tasks("A"), None)
    assert reused.value.field == "tasks[0].id" and "phase 1" in reused.value.message
    with pytest.raises(ValidationError) as cycle:
        service.replan(queue, oid, tasks("X", "Y", deps={"X": ["Y"], "Y": ["X"]}), None)
    assert "dependency cycle" in cycle.value.message
    drain(queue)
    with pytest.raises(ConflictError):
        service.replan(queue, oid, tasks("Z"), None)
    with pytest.raises(service.ObjectiveNotFound):
        service.replan(queue, qualify("org-a", "rp-none"), tasks("Z"), None)


def test_rebuild_gives_the_same_phases(queue: Queue) -> None:
    oid = launch(queue, "rp-4", {"A": []})
    drain(queue, skip_agents=(ECHO,))
    service.replan(queue, oid, tasks("C"), None)
    drain(queue)
    before = statuses(queue, oid)
    with transaction(queue.engine) as conn:
        storage.rebuild(conn)
    assert statuses(queue, oid) == before
    with queue.engine.connect() as conn:
        folded = fold(r.to_receipt() for r in store.read_stream(conn, objective_stream(oid)))
    assert folded is not None and folded.phase == 2 and folded.status == "completed"
