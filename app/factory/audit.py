"""The terminal objective audit: a pure report over an ended objective, its task jobs and chain checks."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from app.factory.reducer import Objective
from app.jobs.ids import client_id_of
from app.jobs.reducer import Job

_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def _ms(start: str | None, end: str | None) -> int | None:
    if not start or not end:
        return None
    delta = datetime.strptime(end, _FORMAT) - datetime.strptime(start, _FORMAT)
    return max(0, round(delta.total_seconds() * 1000))


def critical_path(obj: Objective) -> tuple[int, list[str]]:
    """The longest dependency chain by task run time (queued → settled), and its tasks in order."""
    finish: dict[str, int] = {}
    prev: dict[str, str | None] = {}
    # task_order is a valid plan order only by accident; visit in topological order explicitly.
    remaining = {t: set(obj.tasks[t].depends_on) for t in obj.task_order if t in obj.tasks}
    ready = [t for t, deps in remaining.items() if not deps]
    order: list[str] = []
    dependents = {t: obj.tasks[t].dependents for t in remaining}
    while ready:
        tid = ready.pop()
        order.append(tid)
        for dep in dependents[tid]:
            if dep in remaining:
                remaining[dep].discard(tid)
                if not remaining[dep]:
                    ready.append(dep)
    for tid in order:
        task = obj.tasks[tid]
        own = _ms(task.queued_at, task.settled_at) or 0
        best, via = 0, None
        for dep in task.depends_on:
            f = finish.get(dep)
            if f is not None and (via is None or f > best):
                best, via = f, dep
        finish[tid] = best + own
        prev[tid] = via
    if not finish:
        return 0, []
    end = max(finish, key=lambda t: finish[t])
    path: list[str] = []
    node: str | None = end
    while node is not None:
        path.append(node)
        node = prev.get(node)
    return finish[end], list(reversed(path))


def report(
    obj: Objective, jobs: Mapping[str, Job | None], broken: Mapping[str, str], streams_checked: int
) -> dict[str, Any]:
    """The audit appended as ``objective.audited``: tasks by status, attempts, wall and critical-path
    time, failures with their errors, and whether every stream of the objective verifies."""
    by_status: dict[str, int] = {}
    attempts_total = 0
    retried: dict[str, int] = {}
    failures: list[dict[str, Any]] = []
    for tid in obj.task_order:
        task = obj.tasks.get(tid)
        if task is None:
            continue
        by_status[task.status] = by_status.get(task.status, 0) + 1
        job = jobs.get(task.job_id or "")
        attempt = job.attempt if job is not None else task.attempt
        attempts_total += attempt
        if attempt > 1:
            retried[tid] = attempt
        if task.status in ("failed", "canceled", "skipped"):
            failures.append(
                {
                    "taskId": tid,
                    "status": task.status,
                    "jobId": client_id_of(task.job_id) if task.job_id else None,
                    "error": task.error,
                }
            )
    cp_ms, cp_tasks = critical_path(obj)
    return {
        "status": obj.status,
        "tasksByStatus": by_status,
        "attempts": {"total": attempts_total, "retriedTasks": retried},
        "wallTimeMs": _ms(obj.created_at, obj.ended_at),
        "criticalPathMs": cp_ms,
        "criticalPath": cp_tasks,
        "failures": failures,
        "verified": {
            "ok": not broken,
            "streamsChecked": streams_checked,
            "broken": [{"stream": s, "reason": r} for s, r in sorted(broken.items())],
        },
    }
