"""The objective state machine: a pure fold of ``objectives/<id>`` receipts into an ``Objective``.

No I/O and no clock (times arrive inside receipts). The same three kinds of invariant as jobs:

1. **Ignored unless the state allows it.** ``objective.tasks_queued`` moves only ``pending`` tasks;
   ``objective.task_settled`` only a ``queued`` task; a terminal objective absorbs every task and
   status event (only bookkeeping — requests, their consumption, the audit — still folds).
2. **Fenced.** ``objective.task_settled`` applies only when its ``jobId`` is the task's job, so a
   settlement from another phase's (or a foreign) job is inert.
3. **No objective, no event.** An event for an objective that does not exist raises
   ``Invariant: no objective for <id>``; the exception is ``objective.control_requested``, ignored,
   so a stray outbox write can never break a fold.

The state may be *partial*: storage loads an objective's header and only the tasks a control step
touches (``app.factory.storage``). Every event names the tasks it changes, and the counts by status
live in the header, so folding an event over a partial state gives exactly the rows a full fold
would — ``receipt rebuild-projections`` re-folds everything and tests compare the two.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from app.factory.vocab import (
    CONTROL_MOVES,
    DEFAULT_FAILURE_POLICY,
    FIRST_PHASE,
    PHASE_SUPERSEDED,
    TASK_STATUSES,
    TERMINAL_OBJECTIVE_STATUSES,
    no_objective_message,
    objective_id_of,
    objective_stream,
)
from app.jobs.errors import InvariantError
from app.jobs.ids import client_id_of
from app.jobs.reducer import Receipt
from app.jobs.tracecontext import TRACE_CONTEXT_FIELD, trace_context_of


@dataclass(frozen=True)
class Task:
    """One task of an objective: its plan entry and where it stands."""

    id: str
    agent_id: str
    kind: str
    payload: Mapping[str, Any]
    depends_on: tuple[str, ...]
    dependents: tuple[str, ...]
    max_attempts: int | None = None
    execution_path: str | None = None
    phase: int = FIRST_PHASE
    status: str = "pending"
    deps_remaining: int = 0
    job_id: str | None = None
    attempt: int = 0
    result: Any = None
    error: Any = None
    queued_at: str | None = None
    settled_at: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "agentId": self.agent_id,
            "kind": self.kind,
            "payload": self.payload,
            "dependsOn": list(self.depends_on),
            "dependents": list(self.dependents),
            "maxAttempts": self.max_attempts,
            "executionPath": self.execution_path,
            "phase": self.phase,
            "status": self.status,
            "depsRemaining": self.deps_remaining,
            "jobId": self.job_id,
            "attempt": self.attempt,
            "result": self.result,
            "error": self.error,
            "queuedAt": self.queued_at,
            "settledAt": self.settled_at,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Task:
        return cls(
            id=d["id"],
            agent_id=d["agentId"],
            kind=d["kind"],
            payload=d.get("payload") or {},
            depends_on=tuple(d.get("dependsOn") or ()),
            dependents=tuple(d.get("dependents") or ()),
            max_attempts=d.get("maxAttempts"),
            execution_path=d.get("executionPath"),
            phase=d.get("phase", FIRST_PHASE),
            status=d.get("status", "pending"),
            deps_remaining=d.get("depsRemaining", 0),
            job_id=d.get("jobId"),
            attempt=d.get("attempt", 0),
            result=d.get("result"),
            error=d.get("error"),
            queued_at=d.get("queuedAt"),
            settled_at=d.get("settledAt"),
        )


@dataclass(frozen=True)
class Request:
    """A control request not yet consumed by a control step (the outbox entry)."""

    id: str
    seq: int
    reason: str
    job_id: str | None = None
    task_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "seq": self.seq,
            "reason": self.reason,
            "jobId": self.job_id,
            "taskId": self.task_id,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Request:
        return cls(d["id"], d["seq"], d["reason"], d.get("jobId"), d.get("taskId"))


@dataclass(frozen=True)
class Objective:
    """An objective's folded state. ``tasks`` may hold only the tasks a step loaded (see module doc)."""

    id: str
    title: str
    goal: str
    failure_policy: str
    auth_context: Mapping[str, Any]
    launched_by: Mapping[str, Any] | None
    task_order: tuple[str, ...]
    tasks: Mapping[str, Task]
    status: str = "active"
    phase: int = FIRST_PHASE
    counts: Mapping[str, int] = field(default_factory=dict)
    pending: tuple[Request, ...] = ()
    failing: Mapping[str, Any] | None = None
    cancel: Mapping[str, Any] | None = None
    end: Mapping[str, Any] | None = None
    audit: Any = None
    created_at: str | None = None
    updated_at: str | None = None
    ended_at: str | None = None
    seq: int = 0
    # The control workflow's own counters (the durable ledger's row, without re-reading the stream):
    # ``objective.control_consumed`` receipts so far, and the time of the last CONTROL_MOVES receipt.
    control_steps: int = 0
    control_moved_at: str | None = None
    # The W3C context the launch ran in (app.jobs.tracecontext): the parent of its task jobs' traces.
    trace_context: Mapping[str, str] | None = None

    @property
    def stream(self) -> str:
        return objective_stream(self.id)

    @property
    def client_id(self) -> str:
        """The id the objective's organisation knows it by (``id`` is the organisation-qualified key)."""
        return client_id_of(self.id)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_OBJECTIVE_STATUSES

    @property
    def organization_id(self) -> str | None:
        org = self.auth_context.get("organizationId")
        return org if isinstance(org, str) else None

    def count(self, *statuses: str) -> int:
        return sum(self.counts.get(s, 0) for s in statuses)

    def header_json(self) -> dict[str, Any]:
        """Everything but the tasks: the ``objectives`` projection row's state."""
        return {
            "id": self.id,
            "title": self.title,
            "goal": self.goal,
            "failurePolicy": self.failure_policy,
            "authContext": self.auth_context,
            "launchedBy": self.launched_by,
            "taskOrder": list(self.task_order),
            "status": self.status,
            "phase": self.phase,
            "counts": dict(self.counts),
            "pending": [r.to_json() for r in self.pending],
            "failing": self.failing,
            "cancel": self.cancel,
            "end": self.end,
            "audit": self.audit,
            "createdAt": self.created_at,
            "updatedAt": self.updated_at,
            "endedAt": self.ended_at,
            "seq": self.seq,
            "controlSteps": self.control_steps,
            "controlMovedAt": self.control_moved_at,
            # Only when recorded: a header folded without one stays byte-equal to a rebuild.
            **({TRACE_CONTEXT_FIELD: dict(self.trace_context)} if self.trace_context else {}),
        }

    @classmethod
    def from_header(cls, d: Mapping[str, Any], tasks: Mapping[str, Task]) -> Objective:
        return cls(
            id=d["id"],
            title=d["title"],
            goal=d["goal"],
            failure_policy=d.get("failurePolicy", DEFAULT_FAILURE_POLICY),
            auth_context=d.get("authContext") or {},
            launched_by=d.get("launchedBy"),
            task_order=tuple(d.get("taskOrder") or ()),
            tasks=dict(tasks),
            status=d["status"],
            phase=d.get("phase", FIRST_PHASE),
            counts=dict(d.get("counts") or {}),
            pending=tuple(Request.from_json(r) for r in d.get("pending") or ()),
            failing=d.get("failing"),
            cancel=d.get("cancel"),
            end=d.get("end"),
            audit=d.get("audit"),
            created_at=d.get("createdAt"),
            updated_at=d.get("updatedAt"),
            ended_at=d.get("endedAt"),
            seq=d.get("seq", 0),
            control_steps=d.get("controlSteps", 0),
            control_moved_at=d.get("controlMovedAt"),
            trace_context=trace_context_of(d.get(TRACE_CONTEXT_FIELD)),
        )


def reduce(state: Objective | None, receipt: Receipt) -> Objective | None:
    """Fold one receipt; an inert event returns ``state`` with only ``seq`` moved."""
    kind = receipt.type
    if state is None:
        if kind == "objective.launched":
            return _launched(receipt)
        if kind == "objective.control_requested":
            return None  # invariant 3's exception
        raise InvariantError(no_objective_message(objective_id_of(receipt.stream)))
    handler = _HANDLERS.get(kind)
    new = handler(state, receipt.body, receipt) if handler else None
    if new is None:
        out = replace(state, seq=receipt.seq)
    else:
        out = replace(new, seq=receipt.seq, updated_at=receipt.at or state.updated_at)
    if kind in CONTROL_MOVES:
        # The control workflow's counters move even on an otherwise inert receipt: the ledger
        # counts every such receipt on the stream.
        out = replace(
            out,
            control_steps=out.control_steps + (kind == "objective.control_consumed"),
            control_moved_at=receipt.at or out.control_moved_at,
        )
    return out


_Handler = Callable[[Objective, Mapping[str, Any], Receipt], "Objective | None"]


def fold(receipts: Iterable[Receipt], state: Objective | None = None) -> Objective | None:
    for r in receipts:
        state = reduce(state, r)
    return state


def _strs(value: Any) -> tuple[str, ...]:
    return tuple(v for v in value if isinstance(v, str)) if isinstance(value, list) else ()


def _build_tasks(raw: Any, phase: int) -> dict[str, Task]:
    """The tasks of one phase's plan, with their dependents and dependency counters."""
    raw_tasks = [t for t in raw or [] if isinstance(t, Mapping) and isinstance(t.get("id"), str)]
    dependents: dict[str, list[str]] = {t["id"]: [] for t in raw_tasks}
    for t in raw_tasks:
        for dep in _strs(t.get("dependsOn")):
            if dep in dependents:
                dependents[dep].append(t["id"])
    tasks: dict[str, Task] = {}
    for t in raw_tasks:
        deps = tuple(d for d in _strs(t.get("dependsOn")) if d in dependents)
        payload = t.get("payload")
        tasks[t["id"]] = Task(
            id=t["id"],
            agent_id=str(t.get("agentId", "")),
            kind=str(t.get("kind") or (payload.get("kind") if isinstance(payload, Mapping) else "") or ""),
            payload=payload if isinstance(payload, Mapping) else {},
            depends_on=deps,
            dependents=tuple(dependents[t["id"]]),
            max_attempts=t.get("maxAttempts") if isinstance(t.get("maxAttempts"), int) else None,
            execution_path=t.get("executionPath") if isinstance(t.get("executionPath"), str) else None,
            phase=phase,
            deps_remaining=len(deps),
        )
    return tasks


def _launched(r: Receipt) -> Objective:
    b = r.body
    phase = b.get("phase", FIRST_PHASE)
    phase = phase if isinstance(phase, int) and not isinstance(phase, bool) else FIRST_PHASE
    tasks = _build_tasks(b.get("tasks"), phase)
    auth = b.get("authContext")
    launched_by = b.get("launchedBy")
    return Objective(
        id=str(b.get("objectiveId") or objective_id_of(r.stream)),
        title=str(b.get("title", "")),
        goal=str(b.get("goal", "")),
        failure_policy=str(b.get("failurePolicy", DEFAULT_FAILURE_POLICY)),
        auth_context=auth if isinstance(auth, Mapping) else {},
        launched_by=launched_by if isinstance(launched_by, Mapping) else None,
        task_order=tuple(tasks),
        tasks=tasks,
        phase=phase,
        counts={"pending": len(tasks)} if tasks else {},
        created_at=r.at,
        updated_at=r.at,
        seq=r.seq,
        control_moved_at=r.at,
        trace_context=trace_context_of(b.get(TRACE_CONTEXT_FIELD)),
    )


def _replanned(s: Objective, b: Mapping[str, Any], r: Receipt) -> Objective | None:
    """Phase n+1: its tasks become the plan (``task_order``, ``counts``); every earlier task stays
    visible with its phase. Earlier tasks never started are canceled here; earlier jobs still
    active are stopped by control (and their settlement recorded without touching ``counts``)."""
    phase = b.get("phase")
    if s.terminal or s.cancel is not None or phase != s.phase + 1:
        return None
    new = _build_tasks(b.get("tasks"), phase)
    if not new or any(t in s.tasks for t in new):
        return None  # task ids are unique across the objective's phases
    tasks = dict(s.tasks)
    for tid, task in s.tasks.items():
        if task.status == "pending":
            tasks[tid] = replace(task, status="canceled", error=PHASE_SUPERSEDED, settled_at=r.at)
    tasks.update(new)
    return replace(
        s,
        tasks=tasks,
        task_order=tuple(new),
        phase=phase,
        counts={"pending": len(new)},
        failing=None,
    )


def _move(counts: Mapping[str, int], before: str, after: str) -> dict[str, int]:
    out = dict(counts)
    out[before] = out.get(before, 0) - 1
    out[after] = out.get(after, 0) + 1
    return {k: v for k, v in out.items() if v and k in TASK_STATUSES}


def _duplicate_launch(s: Objective, b: Mapping[str, Any], r: Receipt) -> Objective | None:
    return None  # idempotent by objectiveId: a second launch changes nothing


def _control_requested(s: Objective, b: Mapping[str, Any], r: Receipt) -> Objective | None:
    request_id = b.get("requestId")
    if not isinstance(request_id, str) or any(p.id == request_id for p in s.pending):
        return None
    req = Request(request_id, r.seq, str(b.get("reason", "")), b.get("jobId"), b.get("taskId"))
    return replace(s, pending=(*s.pending, req))


def _control_consumed(s: Objective, b: Mapping[str, Any], r: Receipt) -> Objective | None:
    ids = set(_strs(b.get("requestIds")))
    if not ids or not any(p.id in ids for p in s.pending):
        return None
    return replace(s, pending=tuple(p for p in s.pending if p.id not in ids))


def _tasks_queued(s: Objective, b: Mapping[str, Any], r: Receipt) -> Objective | None:
    if s.terminal:
        return None
    tasks = dict(s.tasks)
    counts = dict(s.counts)
    changed = False
    for entry in b.get("tasks") or []:
        if not isinstance(entry, Mapping):
            continue
        task = tasks.get(str(entry.get("taskId")))
        if task is None or task.status != "pending" or not isinstance(entry.get("jobId"), str):
            continue
        tasks[task.id] = replace(task, status="queued", job_id=entry["jobId"], queued_at=r.at)
        counts = _move(counts, "pending", "queued")
        changed = True
    return replace(s, tasks=tasks, counts=counts) if changed else None


def _task_settled(s: Objective, b: Mapping[str, Any], r: Receipt) -> Objective | None:
    if s.terminal:
        return None
    task = s.tasks.get(str(b.get("taskId")))
    status = b.get("status")
    if (
        task is None
        or task.status not in ("queued", "running")
        or status not in ("completed", "failed", "canceled")
    ):
        return None
    if b.get("jobId") != task.job_id:  # invariant 2: only the task's own job settles it
        return None
    attempt = b.get("attempt")
    tasks = dict(s.tasks)
    tasks[task.id] = replace(
        task,
        status=str(status),
        attempt=attempt if isinstance(attempt, int) else task.attempt,
        result=b.get("result"),
        error=b.get("error"),
        settled_at=r.at,
    )
    if task.phase < s.phase:  # a superseded phase's task: recorded, outside the current plan's counts
        return replace(s, tasks=tasks)
    if status == "completed":
        for dep_id in task.dependents:
            dependent = tasks.get(dep_id)
            if dependent is not None:
                tasks[dep_id] = replace(dependent, deps_remaining=max(0, dependent.deps_remaining - 1))
    return replace(s, tasks=tasks, counts=_move(s.counts, task.status, str(status)))


def _pending_to(status: str) -> _Handler:
    def handler(s: Objective, b: Mapping[str, Any], r: Receipt) -> Objective | None:
        if s.terminal:
            return None
        tasks = dict(s.tasks)
        counts = dict(s.counts)
        changed = False
        for task_id in _strs(b.get("taskIds")):
            task = tasks.get(task_id)
            if task is None or task.status != "pending":
                continue
            tasks[task_id] = replace(task, status=status, error=b.get("reason"), settled_at=r.at)
            counts = _move(counts, "pending", status)
            changed = True
        return replace(s, tasks=tasks, counts=counts) if changed else None

    return handler


def _failing(s: Objective, b: Mapping[str, Any], r: Receipt) -> Objective | None:
    if s.terminal or s.failing is not None:
        return None
    return replace(s, failing={"taskId": b.get("taskId"), "reason": b.get("reason"), "at": r.at})


def _cancel_requested(s: Objective, b: Mapping[str, Any], r: Receipt) -> Objective | None:
    if s.terminal or s.cancel is not None:
        return None
    return replace(s, cancel={"reason": b.get("reason"), "at": r.at})


def _ended(status: str) -> _Handler:
    def handler(s: Objective, b: Mapping[str, Any], r: Receipt) -> Objective | None:
        if s.terminal:
            return None
        end = {k: v for k, v in b.items() if k in ("reason", "failedTasks")}
        return replace(s, status=status, end=end, ended_at=r.at)

    return handler


def _audited(s: Objective, b: Mapping[str, Any], r: Receipt) -> Objective | None:
    if not s.terminal or s.audit is not None:
        return None
    return replace(s, audit=b.get("report"))


_HANDLERS: dict[str, _Handler] = {
    "objective.launched": _duplicate_launch,
    "objective.replanned": _replanned,
    "objective.control_requested": _control_requested,
    "objective.control_consumed": _control_consumed,
    "objective.tasks_queued": _tasks_queued,
    "objective.task_settled": _task_settled,
    "objective.tasks_skipped": _pending_to("skipped"),
    "objective.tasks_canceled": _pending_to("canceled"),
    "objective.failing": _failing,
    "objective.cancel_requested": _cancel_requested,
    "objective.completed": _ended("completed"),
    "objective.failed": _ended("failed"),
    "objective.canceled": _ended("canceled"),
    "objective.audited": _audited,
}
