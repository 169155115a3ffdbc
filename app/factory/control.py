"""The control decision: a pure function of (objective, the jobs of its tasks) → receipts + actions.

Objective control is the one place that decides what an objective does next (resume, the outbox
redrive and — next issue — the watchdog only ever *write requests*). ``decide`` folds the receipts
it proposes over the state as it goes, so later rules see earlier ones, and returns:

- the receipts to append to ``objectives/<id>`` (in order);
- the tasks to enqueue (deterministic job ids; their payloads are built by ``task_payload`` once
  their dependencies' results are loaded);
- the jobs to cancel (failFast or an objective cancel);
- whether the objective ended (the caller then queues the terminal audit).

Rules, in order: record each settled task job; skip the
dependents of a task that did not complete (both policies); under ``failFast`` the first failure
cancels the pending tasks and the active jobs, and so does an objective cancel; otherwise enqueue
every pending task whose dependencies all completed; consume the requests answered; end the
objective when nothing is pending or active — ``canceled`` after a cancel, ``completed`` when
every task completed, else ``failed``.

Every rule is idempotent: a second step over the same state proposes nothing new, and a step
running twice or beside another is safe because its receipts are appended optimistically (a
conflict re-reads and re-decides) and its enqueues use deterministic job ids.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.factory.plan import TaskSpec, stamp_payload
from app.factory.reducer import Objective, Task, reduce
from app.factory.vocab import FIRST_PHASE, PHASE_SUPERSEDED, task_job_id
from app.jobs.reducer import Job, Receipt
from app.jobs.vocab import ACTIVE_STATUSES

Event = tuple[str, dict[str, Any]]
# A task job that did not complete takes its dependents with it.
NOT_COMPLETED = ("failed", "canceled", "skipped")


@dataclass(frozen=True)
class CancelJob:
    job_id: str
    reason: str


@dataclass
class Decision:
    """What one control step does. ``state`` is the objective after ``events``."""

    state: Objective
    events: list[Event] = field(default_factory=list)
    enqueue: list[str] = field(default_factory=list)  # task ids whose job must exist
    cancel: list[CancelJob] = field(default_factory=list)
    ended: str | None = None


def _emit(d: Decision, type_: str, body: dict[str, Any]) -> None:
    d.events.append((type_, body))
    receipt = Receipt(stream=d.state.stream, seq=d.state.seq + 1, type=type_, body=body, at=None)
    new = reduce(d.state, receipt)
    assert new is not None
    d.state = new


def _ordered(obj: Objective, statuses: Sequence[str]) -> list[Task]:
    """Loaded tasks in one of ``statuses``, in plan order (decisions must not depend on dict order)."""
    return [obj.tasks[t] for t in obj.task_order if t in obj.tasks and obj.tasks[t].status in statuses]


def _superseded(obj: Objective) -> list[Task]:
    """Loaded tasks of earlier phases that still hold a job, in a stable order."""
    return sorted(
        (t for t in obj.tasks.values() if t.phase < obj.phase and t.status in ("queued", "running")),
        key=lambda t: (t.phase, t.id),
    )


def settlement(task: Task, job: Job | None, obj: Objective) -> dict[str, Any] | None:
    """The ``objective.task_settled`` body for a queued task whose job has settled, else None."""
    if job is None:
        return None
    if not owns(obj, task, job):
        # The deterministic id is held by a job that is not this task's (posted by hand before the
        # objective reached it): the task cannot run under its id, so it fails rather than adopt it.
        return {
            "taskId": task.id,
            "jobId": task.job_id,
            "status": "failed",
            "attempt": 0,
            "result": None,
            "error": f"job id {task.job_id} is held by a job that is not this task's",
        }
    if not job.terminal:
        return None
    return {
        "taskId": task.id,
        "jobId": job.id,
        "status": job.status,
        "attempt": job.attempt,
        "result": job.result,
        "error": job.error,
    }


def owns(obj: Objective, task: Task, job: Job) -> bool:
    """True when ``job`` is really ``task``'s job: same objective, task and organisation."""
    return (
        job.payload.get("objectiveId") == obj.client_id
        and job.payload.get("taskId") == task.id
        and job.organization_id == obj.organization_id
    )


def needs_full_view(obj: Objective, jobs: Mapping[str, Job | None]) -> bool:
    """True when the step must see every unfinished task (a failure, a cancel, a broad request)."""
    from app.factory.vocab import BROAD_REASONS

    if obj.failing is not None or obj.cancel is not None:
        return True
    if obj.phase > FIRST_PHASE:
        return True  # a replanned objective: earlier phases' unfinished tasks must be seen too
    if any(r.reason in BROAD_REASONS for r in obj.pending):
        return True
    return any(j is None or j.status in ("failed", "canceled") for j in jobs.values())


def decide(obj: Objective, jobs: Mapping[str, Job | None]) -> Decision:
    """One control step over ``obj`` (header + the tasks loaded for it) and its tasks' jobs.

    ``jobs`` maps each job id the caller read to the job, or to None when no such job exists (a
    task recorded as queued whose job is missing is enqueued again); ids not in it were not read.
    """
    d = Decision(state=obj)
    if d.state.terminal:
        if obj.pending:
            _emit(d, "objective.control_consumed", {"requestIds": [r.id for r in obj.pending]})
        return d

    # 0. Earlier phases (a replan): record what settled, stop what is still active.
    superseded = _superseded(d.state)
    for task in superseded:
        job = jobs.get(task.job_id or "")
        if job is None and task.job_id in jobs:
            body: dict[str, Any] | None = {
                "taskId": task.id,
                "jobId": task.job_id,
                "status": "canceled",
                "attempt": 0,
                "result": None,
                "error": PHASE_SUPERSEDED,
            }
        else:
            body = settlement(task, job, obj)
        if body is not None:
            _emit(d, "objective.task_settled", body)
        elif job is not None and job.status in ACTIVE_STATUSES and not job.abort_requested:
            d.cancel.append(CancelJob(job.id, PHASE_SUPERSEDED))

    # 1. Record each settled task job (only the task's own job settles it).
    for task in _ordered(d.state, ("queued", "running")):
        if task.job_id is None:
            continue
        job = jobs.get(task.job_id)
        if job is None and task.job_id in jobs:
            d.enqueue.append(task.id)  # queued on the objective but its job is missing: make it
            continue
        body = settlement(task, job, obj)
        if body is not None:
            _emit(d, "objective.task_settled", body)

    # 2. Dependents of a task that did not complete can never run.
    bad = [t for t in _ordered(d.state, NOT_COMPLETED)]
    doomed: list[str] = []
    frontier = [dep for t in bad for dep in t.dependents]
    seen: set[str] = set()
    while frontier:
        tid = frontier.pop()
        if tid in seen:
            continue
        seen.add(tid)
        candidate = d.state.tasks.get(tid)
        if candidate is not None and candidate.status == "pending":
            doomed.append(tid)
            frontier.extend(candidate.dependents)
    if doomed:
        order = {t: i for i, t in enumerate(d.state.task_order)}
        doomed.sort(key=lambda t: order.get(t, 0))
        _emit(d, "objective.tasks_skipped", {"taskIds": doomed, "reason": "a dependency did not complete"})

    # 3. failFast: the first task that failed for good stops the objective.
    failed = [t for t in _ordered(d.state, ("failed", "canceled"))]
    if d.state.failure_policy == "failFast" and failed and d.state.failing is None and d.state.cancel is None:
        first = failed[0]
        _emit(d, "objective.failing", {"taskId": first.id, "reason": f"task {first.id} {first.status}"})

    stopping = d.state.cancel is not None or d.state.failing is not None
    if stopping:
        reason = (
            f"objective canceled: {d.state.cancel.get('reason') or 'cancel requested'}"
            if d.state.cancel is not None
            else f"objective failing: {(d.state.failing or {}).get('reason')}"
        )
        pending = [t.id for t in _ordered(d.state, ("pending",))]
        if pending:
            _emit(d, "objective.tasks_canceled", {"taskIds": pending, "reason": reason})
        for task in _ordered(d.state, ("queued", "running")):
            job = jobs.get(task.job_id or "")
            if task.id in d.enqueue:
                # Its job never came to exist, and nothing new may start now: the task is over.
                d.enqueue.remove(task.id)
                _emit(
                    d,
                    "objective.task_settled",
                    {
                        "taskId": task.id,
                        "jobId": task.job_id,
                        "status": "canceled",
                        "attempt": 0,
                        "result": None,
                        "error": reason,
                    },
                )
            elif job is not None and job.status in ACTIVE_STATUSES and not job.abort_requested:
                d.cancel.append(CancelJob(job.id, reason))
    else:
        # 4. Every pending task whose dependencies all completed is ready.
        ready = [t for t in _ordered(d.state, ("pending",)) if t.deps_remaining == 0]
        if ready:
            _emit(
                d,
                "objective.tasks_queued",
                {
                    "phase": d.state.phase,
                    "tasks": [{"taskId": t.id, "jobId": task_job_id(obj.id, t.phase, t.id)} for t in ready],
                },
            )
            d.enqueue.extend(t.id for t in ready)

    # Consume the requests this step answered. A request about a task this step is only now
    # recording as queued stays pending: its job (enqueued by an earlier, concurrent step) may have
    # settled already, and only a step that sees the task queued can record that settlement.
    enqueued = set(d.enqueue)
    consumed = [r.id for r in obj.pending if r.task_id not in enqueued]
    if consumed:
        _emit(d, "objective.control_consumed", {"requestIds": consumed})

    # 5. The graph is done when nothing is pending or active.
    s = d.state
    # An earlier phase's job still stopping keeps the objective open, so it never ends with work running.
    if s.count("pending", "queued", "running") == 0 and not d.enqueue and not _superseded(s):
        if s.cancel is not None:
            d.ended = "canceled"
            _emit(d, "objective.canceled", {"reason": s.cancel.get("reason") or "cancel requested"})
        elif s.count("failed", "canceled", "skipped") == 0:
            d.ended = "completed"
            _emit(d, "objective.completed", {"reason": "every task completed"})
        else:
            d.ended = "failed"
            not_done = s.count("failed", "canceled", "skipped")
            _emit(
                d, "objective.failed", {"reason": f"{not_done} of {len(s.task_order)} tasks did not complete"}
            )
    return d


def task_spec(task: Task) -> TaskSpec:
    return TaskSpec(
        id=task.id,
        agent_id=task.agent_id,
        kind=task.kind,
        payload={k: v for k, v in task.payload.items()},
        depends_on=task.depends_on,
        max_attempts=task.max_attempts,
        execution_path=task.execution_path,
    )


def task_payload(obj: Objective, task: Task, dependency_results: Mapping[str, Any]) -> dict[str, Any]:
    """The task job's payload: stamped with the objective's authContext, ids and phase, and each
    dependency's result as ``inputs.<taskId>`` (Hatchet's parent outputs, Oban Pro's recorded results)."""
    inputs = {dep: dependency_results.get(dep) for dep in task.depends_on}
    return stamp_payload(
        task_spec(task),
        objective_id=obj.client_id,
        phase=task.phase,
        auth_context=obj.auth_context,
        inputs=inputs,
    )
