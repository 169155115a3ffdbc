"""An objective as the API shows it, and the small events that keep a client's copy current.

Pure: no I/O, no request. ``task_json``/``objective_json`` are the shapes of ``GET
/objectives/<id>``; a task whose fold status is ``queued`` or ``running`` takes its status and
attempt from its job (the live ``running`` overlay). ``ObjectiveView`` remembers what one event
stream has sent, so that after the first event (a snapshot) each event carries only what changed:

- ``after_receipt`` — one per objective receipt: its ``seq`` and ``type``, ``updatedAt``, the
  tasks whose shown state changed, and ``status``/``phase``/``audit`` only when they changed;
- ``overlay`` — the tasks whose job's lease changed their shown state (a queued task's job
  started running, or a retry put it back to queued), without a new objective receipt.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from app.factory.reducer import Objective, Task
from app.jobs.ids import client_id_of
from app.jobs.reducer import Job
from app.jobs.vocab import LEASED_STATUSES, job_stream

# Fold statuses whose shown status comes from the task's job (the overlay).
OVERLAID = ("queued", "running")


def task_json(task: Task, job: Job | None = None) -> dict[str, Any]:
    """One task as the API shows it; ``running`` and the live attempt come from its job's lease."""
    status = task.status
    attempt = task.attempt
    if job is not None and status in OVERLAID:
        attempt = job.attempt
        status = "running" if job.status in LEASED_STATUSES else "queued"
    return {
        "id": task.id,
        "agentId": task.agent_id,
        "kind": task.kind,
        "dependsOn": list(task.depends_on),
        "status": status,
        "jobId": client_id_of(task.job_id) if task.job_id else None,
        "jobStream": job_stream(task.job_id) if task.job_id else None,
        "attempt": attempt,
        "result": task.result,
        "error": task.error,
        "phase": task.phase,
    }


def every_phase(obj: Objective) -> list[Task]:
    """Earlier phases' tasks first (by phase, then id), then the current plan in its own order."""
    earlier = sorted((t for t in obj.tasks.values() if t.phase < obj.phase), key=lambda t: (t.phase, t.id))
    return earlier + [obj.tasks[t] for t in obj.task_order if t in obj.tasks]


def objective_json(obj: Objective, jobs: Mapping[str, Job | None] | None = None) -> dict[str, Any]:
    jobs = jobs or {}
    return {
        "id": obj.client_id,
        "organizationId": obj.organization_id,
        "stream": obj.stream,
        "title": obj.title,
        "goal": obj.goal,
        "status": obj.status,
        "phase": obj.phase,
        "failurePolicy": obj.failure_policy,
        "tasks": [task_json(t, jobs.get(t.job_id or "")) for t in every_phase(obj)],
        "audit": obj.audit,
        "createdAt": obj.created_at,
        "updatedAt": obj.updated_at,
    }


def overlaid_jobs(obj: Objective) -> dict[str, str]:
    """job id → task id for every task whose shown status its job decides."""
    return {t.job_id: t.id for t in obj.tasks.values() if t.status in OVERLAID and t.job_id}


class ObjectiveView:
    """What one event stream has sent of an objective; each method returns the next event's data."""

    def __init__(self) -> None:
        self.tasks: dict[str, dict[str, Any]] = {}
        self.status = ""
        self.phase = 0
        self.audit: Any = None

    def snapshot(self, obj: Objective, jobs: Mapping[str, Job | None]) -> dict[str, Any]:
        out = objective_json(obj, jobs)
        self.tasks = {t["id"]: t for t in out["tasks"]}
        self.status, self.phase, self.audit = obj.status, obj.phase, obj.audit
        return out

    def after_receipt(
        self,
        before: Objective,
        after: Objective,
        receipt_type: str,
        jobs: Mapping[str, Job | None],
    ) -> dict[str, Any]:
        """The delta for the receipt that took ``before`` to ``after`` (O(tasks), cheap per task:
        the reducer replaces only the tasks a receipt touches, so the others are the same objects)."""
        touched = [tid for tid, t in after.tasks.items() if before.tasks.get(tid) is not t]
        out: dict[str, Any] = {
            "seq": after.seq,
            "type": receipt_type,
            "updatedAt": after.updated_at,
            "tasks": self._changed(after, touched, jobs),
        }
        if after.status != self.status:
            out["status"] = self.status = after.status
        if after.phase != self.phase:
            out["phase"] = self.phase = after.phase
        if after.audit != self.audit:
            out["audit"] = self.audit = after.audit
        return out

    def overlay(
        self, obj: Objective, task_ids: Iterable[str], jobs: Mapping[str, Job | None]
    ) -> list[dict[str, Any]]:
        """The tasks among ``task_ids`` whose shown state their job changed since last sent."""
        return self._changed(obj, task_ids, jobs)

    def _changed(
        self, obj: Objective, task_ids: Iterable[str], jobs: Mapping[str, Job | None]
    ) -> list[dict[str, Any]]:
        out = []
        for tid in task_ids:
            task = obj.tasks.get(tid)
            if task is None:
                continue
            shown = task_json(task, jobs.get(task.job_id or ""))
            if self.tasks.get(tid) != shown:
                self.tasks[tid] = shown
                out.append(shown)
        return out
