"""Factory operations: the I/O around the pure rules, each a short transaction over the store.

``launch`` and ``cancel`` write their control request in their own transaction; ``control_step``
reads the objective and the jobs of the tasks it must look at, lets ``control.decide`` choose,
performs the idempotent actions (enqueue under deterministic job ids, cancel), then appends the
receipts optimistically — a conflict with anything but a newer control request re-reads and
re-decides. ``ensure_control_job`` is the outbox's fast path (after every commit that wrote a
request) and also what the outbox redrive calls; ``resume`` writes a request per active
objective; ``run_audit`` is the terminal audit job. Nothing here imports Celery or Flask.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection, Engine

from app import tracing
from app.factory import audit, control, monitor, storage
from app.factory.hooks import ControlOutbox
from app.factory.plan import ObjectiveSpec, TaskSpec, validate_plan
from app.factory.reducer import Objective, Task
from app.factory.vocab import (
    CONTROL_MAX_ATTEMPTS,
    FIRST_PHASE,
    MAX_CONTROL_GENERATIONS,
    audit_job_id,
    control_job_id,
    objective_stream,
    task_job_id,
)
from app.jobs import kinds
from app.jobs.errors import (
    AppendConflict,
    ConflictError,
    ReceiptError,
    ValidationError,
)
from app.jobs.ids import KEY_SEPARATOR, client_id_of, new_id, qualify
from app.jobs.privilege import Enqueuer
from app.jobs.reducer import Job
from app.jobs.tracecontext import TRACE_CONTEXT_FIELD
from app.jobs.validation import EnqueueRequest
from app.jobs.vocab import MAX_ATTEMPTS_DEFAULT, job_stream
from app.storage import store, tombstones
from app.storage.db import Reads, db_now, jobs, read_connection, session_lock, shared_reads, transaction
from app.storage.queue import Queue
from app.storage.retry import optimistic
from app.storage.tombstones import Tombstone

log = logging.getLogger("receipt.factory")

COMPUTER_PATH = "computer"
# A monitor that dies is restarted by lease expiry once; after that the watchdog covers the task.
MONITOR_MAX_ATTEMPTS = 2
STEP_LOCK_WAIT_S = 60.0
AUDIT_MAX_ATTEMPTS = 3


class ObjectiveNotFound(ReceiptError):
    """No objective with that id (or not one the caller may see)."""


@dataclass(frozen=True)
class LaunchResult:
    objective: Objective
    created: bool


def system_launcher() -> dict[str, Any]:
    """``launchedBy`` of an objective Receipt itself launches with every right (operators, tests)."""
    return Enqueuer(token_id=None, scopes=(), system=True).to_json()


def launcher_from(enqueuer: Enqueuer | None) -> dict[str, Any]:
    """``launchedBy`` for an objective a job launches (``factory.dispatch``/``run``): that job's own
    enqueuer, so an objective never holds more rights than whoever asked for it (no enqueuer: none)."""
    return (enqueuer or Enqueuer(token_id=None, scopes=(), system=False)).to_json()


# -- reads --------------------------------------------------------------------------------------


def get(engine: Engine, objective_id: str, *, all_tasks: bool = True) -> Objective | None:
    """The objective with this storage key (``Objective.id``)."""
    with engine.connect() as conn:
        loaded = storage.load(conn, objective_id, all_tasks=all_tasks)
    return loaded.objective if loaded else None


def find(
    engine: Engine, organization_id: str | None, objective_id: str, *, all_tasks: bool = True
) -> Objective | None:
    """The objective an organisation knows as ``objective_id`` (another's is exactly as absent)."""
    with engine.connect() as conn:
        key = storage.key_of(conn, organization_id, objective_id)
        loaded = storage.load(conn, key, all_tasks=all_tasks) if key is not None else None
    return loaded.objective if loaded else None


def archived(engine: Engine, organization_id: str | None, objective_id: str) -> Tombstone | None:
    """The tombstone of the objective an organisation knew as ``objective_id``, if it was archived."""
    if KEY_SEPARATOR in objective_id:
        return None
    with read_connection(engine) as conn:
        return tombstones.find(conn, objective_stream(qualify(organization_id, objective_id)))


def key_of(engine: Engine, organization_id: str | None, objective_id: str) -> str:
    """The key of the organisation's objective ``objective_id``; ``ObjectiveNotFound`` if it has none."""
    with read_connection(engine) as conn:
        key = storage.key_of(conn, organization_id, objective_id)
    if key is None:
        raise ObjectiveNotFound(objective_id)
    return key


def read_jobs(engine: Engine, job_ids: Iterable[str]) -> dict[str, Job | None]:
    """The jobs with these ids from the projection, None for each that does not exist (one query)."""
    ids = [j for j in job_ids if j]
    if not ids:
        return {}
    with read_connection(engine) as conn:
        return read_jobs_on(conn, ids)


def read_jobs_on(conn: Connection, job_ids: Iterable[str]) -> dict[str, Job | None]:
    ids = sorted({j for j in job_ids if j})
    out: dict[str, Job | None] = dict.fromkeys(ids)
    for i in range(0, len(ids), 500):
        for row in conn.execute(select(jobs.c.id, jobs.c.state).where(jobs.c.id.in_(ids[i : i + 500]))):
            out[row.id] = Job.from_json(row.state)
    return out


# -- launch and cancel ----------------------------------------------------------------------------


def launch(queue: Queue, spec: ObjectiveSpec, *, launched_by: Mapping[str, Any]) -> LaunchResult:
    """Write ``objective.launched`` and its ``launch`` control request in one transaction.

    Idempotent by objectiveId: an existing objective is returned unchanged (the caller checks that
    it belongs to the same organisation).
    """
    org = spec.organization_id
    # A client's objectiveId is unique within its organisation: the key carries the organisation.
    explicit = spec.objective_id
    objective_id = qualify(org, explicit or new_id("obj_"))
    body = {
        "objectiveId": objective_id,
        "title": spec.title,
        "goal": spec.goal,
        "failurePolicy": spec.failure_policy,
        "authContext": dict(spec.auth_context),
        "launchedBy": dict(launched_by),
        "phase": FIRST_PHASE,
        "tasks": [t.to_json() for t in spec.tasks],
    }
    # The objective's own trace: its task jobs are children of it (enqueue_task_job).
    trace_context = tracing.enqueue_context()
    if trace_context is not None:
        body[TRACE_CONTEXT_FIELD] = trace_context

    def attempt() -> LaunchResult:
        with transaction(queue.engine) as conn:
            storage.lock(conn, objective_id)
            known = storage.key_of(conn, org, explicit) if explicit is not None else None
            existing = storage.load(conn, known) if known is not None else None
            if existing is not None:
                return LaunchResult(existing.objective, created=False)
            if explicit is not None:
                gone = tombstones.find(conn, objective_stream(objective_id))
                if gone is not None:
                    raise gone.refusal()  # archived: the id stays taken
            events: list[storage.Event] = [
                ("objective.launched", body),
                ("objective.control_requested", {"requestId": "launch", "reason": "launch"}),
            ]
            return LaunchResult(
                storage.apply(conn, None, objective_id, events, at=db_now(conn)).objective, True
            )

    result = optimistic(attempt, what=f"launching {objective_id}")
    if result.created:
        _fast_path(queue, objective_id, known=result.objective)
    return result


def cancel(queue: Queue, objective_id: str, reason: str | None) -> Objective:
    """Request cancellation (``objective.cancel_requested`` + a ``cancel`` control request).

    The objective ends ``canceled`` once control has stopped every task. A terminal objective
    refuses (ConflictError); a second cancel while one is pending changes nothing.
    """
    with transaction(queue.engine) as conn:
        storage.lock(conn, objective_id)
        loaded = storage.load(conn, objective_id)
        if loaded is None:
            raise ObjectiveNotFound(objective_id)
        obj = loaded.objective
        if obj.terminal:
            raise ConflictError(f"objective {objective_id} is already {obj.status}")
        if obj.cancel is not None:
            return obj
        events: list[storage.Event] = [
            ("objective.cancel_requested", {"reason": reason}),
            ("objective.control_requested", {"requestId": f"cancel-{obj.seq + 1}", "reason": "cancel"}),
        ]
        obj = storage.apply(conn, loaded, objective_id, events, at=db_now(conn)).objective
    _fast_path(queue, objective_id, known=obj)
    return obj


def replan(
    queue: Queue,
    objective_id: str,
    raw_tasks: Any,
    reason: str | None,
    authorize: Callable[[Sequence[TaskSpec]], None] | None = None,
) -> Objective:
    """Start phase n+1 with a new plan (``objective.replanned`` + a ``replan`` request, one transaction).

    The plan is validated exactly as at launch (under the objective's authContext); its task ids
    must also be new to the objective, so every earlier phase's task stays visible under its own id.
    A terminal objective, or one being canceled, refuses (ConflictError). Control then stops the
    earlier phases (queued jobs canceled, running ones sent ``abort`` with reason ``phase
    superseded``) and runs the new one.
    """
    with queue.engine.connect() as conn:
        current = storage.load(conn, objective_id, all_tasks=True)
    if current is None:
        raise ObjectiveNotFound(objective_id)
    _check_replannable(current.objective)  # 409 once terminal, whatever the body
    tasks = _replan_tasks(raw_tasks, current.objective)
    if authorize is not None:
        authorize(tasks)  # after validation, as at launch: a bad plan is a 400 before any 403

    def attempt() -> Objective:
        with transaction(queue.engine) as conn:
            storage.lock(conn, objective_id)
            loaded = storage.load(conn, objective_id, all_tasks=True)
            if loaded is None:
                raise ObjectiveNotFound(objective_id)
            obj = loaded.objective
            _check_replannable(obj)
            tasks = _replan_tasks(raw_tasks, obj)
            body = {"phase": obj.phase + 1, "reason": reason, "tasks": [t.to_json() for t in tasks]}
            events: list[storage.Event] = [
                ("objective.replanned", body),
                ("objective.control_requested", {"requestId": f"replan-{obj.phase + 1}", "reason": "replan"}),
            ]
            return storage.apply(conn, loaded, objective_id, events, at=db_now(conn)).objective

    after = optimistic(attempt, what=f"replanning {objective_id}")
    _fast_path(queue, objective_id)
    return after


def _check_replannable(obj: Objective) -> None:
    if obj.terminal:
        raise ConflictError(f"objective {obj.id} is already {obj.status}")
    if obj.cancel is not None:
        raise ConflictError(f"objective {obj.id} is being canceled")


def _replan_tasks(raw_tasks: Any, obj: Objective) -> tuple[TaskSpec, ...]:
    try:
        tasks = validate_plan({"tasks": raw_tasks}, obj.auth_context)
    except ValidationError as exc:  # the replan body's field is ``tasks``, not ``plan.tasks``
        raise ValidationError(exc.field.removeprefix("plan."), exc.reason, exc.allowed) from None
    for index, task in enumerate(tasks):
        if task.id in obj.tasks:
            phase = obj.tasks[task.id].phase
            raise ValidationError(
                f"tasks[{index}].id",
                f"task id {task.id!r} is already used by phase {phase} of this objective",
            )
    return tasks


def request(queue: Queue, objective_id: str, reason: str, detail: Mapping[str, Any] | None = None) -> bool:
    """Write a control request (resume, redrive, reconcile) for an active objective; False if none.

    ``detail`` (the watchdog's finding) is recorded on the request receipt for the operator."""
    body: dict[str, Any] = {"requestId": f"{reason}-{new_id()}", "reason": reason}
    if detail:
        body["detail"] = dict(detail)
    with transaction(queue.engine) as conn:
        written = storage.request_control(conn, objective_id, body, unless_pending=reason == "reconcile")
    if written is not None:
        _fast_path(queue, objective_id, known=written)
    return written is not None


# -- the outbox fast path -------------------------------------------------------------------------


def _fast_path(queue: Queue, objective_id: str, *, known: Objective | None = None) -> None:
    """Enqueue the control job at once, where the queue runs the control outbox's fast path."""
    outbox = queue.hook(ControlOutbox)
    if outbox is None or not outbox.fast_path:
        return
    try:
        ensure_control_job(queue, objective_id, known=known)
    except Exception:  # best-effort: the outbox redrive enqueues what this misses
        log.exception("control fast path for %s failed; the outbox redrive will catch it", objective_id)


def ensure_control_job(queue: Queue, objective_id: str, *, known: Objective | None = None) -> Job | None:
    """Make sure a control job will look at the objective's oldest unconsumed request.

    Job ids are derived from that request (its stream seq) and a generation: every request that
    arrives while generation g is still *queued* maps to that same job (coalescing, so a burst of
    settlements costs one step), and a repeat is a no-op. Once generation g has started (it may
    have read the objective before the newest request) or ended without consuming the request (it
    failed for good, or its worker died), generation g + 1 is created. Two steps at once are safe.

    ``known`` is the objective as the transaction that just wrote a request left it (the fast path
    after a job's settlement): it is not read again. If a step consumed that request meanwhile, the
    job made for it finds nothing to do; correctness never rests on this read being fresh.
    """
    obj = known
    if obj is None:
        with read_connection(queue.engine) as conn:
            loaded = storage.load(conn, objective_id)
        obj = loaded.objective if loaded is not None else None
    if obj is None or not obj.pending:
        return None
    oldest = obj.pending[0]
    payload = {
        "kind": kinds.CONTROL.name,
        "objectiveId": obj.client_id,
        "reason": obj.pending[-1].reason,
        "requestId": obj.pending[-1].id,
        "authContext": dict(obj.auth_context),
    }
    for generation in range(MAX_CONTROL_GENERATIONS):
        # Enqueue is idempotent on the job id: one transaction creates generation g, or reads it.
        req = EnqueueRequest(
            agent_id=kinds.CONTROL.agent,
            payload=payload,
            key=control_job_id(objective_id, oldest.seq, generation),
            max_attempts=CONTROL_MAX_ATTEMPTS,
        )
        result = queue.enqueue(req)
        if result.created or result.job.status == "queued":
            return result.job
    log.error(
        "objective %s: request %s still unconsumed after %d control jobs",
        objective_id,
        oldest.id,
        MAX_CONTROL_GENERATIONS,
    )
    return None


def ensure_audit_job(queue: Queue, obj: Objective) -> Job | None:
    """The terminal audit job (deterministic id). Only a control step ends an objective, so the
    control kind's ``terminalObjectiveAudit`` decides whether an ended objective gets one."""
    if not kinds.CONTROL.contract.terminal_objective_audit or obj.audit is not None:
        return None
    payload = {"kind": kinds.AUDIT.name, "objectiveId": obj.client_id, "authContext": dict(obj.auth_context)}
    req = EnqueueRequest(
        agent_id=kinds.AUDIT.agent, payload=payload, key=audit_job_id(obj.id), max_attempts=AUDIT_MAX_ATTEMPTS
    )
    return queue.enqueue(req).job


# -- the control step -------------------------------------------------------------------------------


def enqueue_task_job(queue: Queue, obj: Objective, task: Task, payload: Mapping[str, Any]) -> Job:
    """The one place a task's job is enqueued (deterministic id: objective, phase, task).

    Launcher identity: the objective's ``launchedBy`` ({tokenId, scopes, system}) is recorded as
    the job's ``enqueuedBy``, so the codex handler's re-check applies to task jobs exactly
    as to jobs posted over HTTP.
    """
    req = EnqueueRequest(
        agent_id=task.agent_id,
        payload=dict(payload),
        key=task_job_id(obj.id, task.phase, task.id),
        max_attempts=task.max_attempts or MAX_ATTEMPTS_DEFAULT,
        trace_context=obj.trace_context,
    )
    job = queue.enqueue(req, enqueued_by=launcher_identity(obj)).job
    if task.execution_path == COMPUTER_PATH:
        ensure_monitor(queue, obj, task, job.id)
    return job


def ensure_monitor(queue: Queue, obj: Objective, task: Task, job_id: str) -> Job:
    """A sandboxed task's ``factory.task.monitor`` job (deterministic id: one per task job)."""
    payload = {
        "kind": kinds.MONITOR.name,
        "objectiveId": obj.client_id,
        "taskId": task.id,
        "phase": task.phase,
        "taskJobId": client_id_of(job_id),
        # Selects the spec's lease row: max(JOB_LEASE_MS, CODEX_JOB_LEASE_MS).
        "executionPath": COMPUTER_PATH,
        "authContext": dict(obj.auth_context),
    }
    req = EnqueueRequest(
        agent_id=kinds.MONITOR.agent,
        payload=payload,
        key=monitor.monitor_job_id(job_id),
        max_attempts=MONITOR_MAX_ATTEMPTS,
    )
    return queue.enqueue(req).job


def launcher_identity(obj: Objective) -> Enqueuer:
    """Who the objective's task jobs act for; a missing or malformed record grants nothing."""
    return Enqueuer.from_json(obj.launched_by) or Enqueuer(token_id=None, scopes=(), system=False)


@dataclass(frozen=True)
class StepResult:
    objective: Objective
    appended: int
    enqueued: int
    canceled: int
    ended: str | None
    cpu_ms: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "objectiveId": self.objective.id,
            "status": self.objective.status,
            "appended": self.appended,
            "enqueued": self.enqueued,
            "canceled": self.canceled,
            "ended": self.ended,
            "cpuMs": self.cpu_ms,
        }


def _read_for_step(reads: Reads, objective_id: str) -> tuple[storage.Loaded, dict[str, Job | None]]:
    """The header, the tasks this step must look at, and their jobs — O(tasks named by requests)
    unless a failure, a cancel or a broad request needs every unfinished task."""
    with reads() as conn:
        loaded = storage.load(conn, objective_id)
        if loaded is None:
            raise ObjectiveNotFound(objective_id)
        named = [r.task_id for r in loaded.objective.pending if r.task_id]
        loaded = storage.with_tasks(conn, loaded, task_ids=named)
        dependents = [
            d for t in named if t in loaded.objective.tasks for d in loaded.objective.tasks[t].dependents
        ]
        loaded = storage.with_tasks(conn, loaded, task_ids=dependents)
    job_ids = [
        t.job_id for t in loaded.objective.tasks.values() if t.status in ("queued", "running") and t.job_id
    ]
    with reads() as conn:
        found = read_jobs_on(conn, job_ids)
        if control.needs_full_view(loaded.objective, found):
            loaded = storage.with_tasks(conn, loaded, statuses=("pending", "queued", "running"))
            more = [
                t.job_id
                for t in loaded.objective.tasks.values()
                if t.status in ("queued", "running") and t.job_id and t.job_id not in found
            ]
            found.update(read_jobs_on(conn, more))
    return loaded, found


def control_step(queue: Queue, objective_id: str) -> StepResult:
    """One idempotent control step (the ``factory.objective.control`` job's work).

    Steps on one objective take turns (a per-objective session lock, waited for up to
    ``STEP_LOCK_WAIT_S``): a step that starts while another runs would decide on the state before
    the other's receipts and repeat its enqueues. Correctness never depends on the lock — without it
    (SQLite, or after the wait) the optimistic append still re-reads and re-decides.
    """
    lock_name = f"objective-step:{objective_id}"
    # The step's reads and its session lock share one connection (Reads), its writes have their own.
    with (
        shared_reads(queue.engine) as reads,
        session_lock(queue.engine, lock_name, wait_s=STEP_LOCK_WAIT_S, conn=reads.held) as taken,
    ):
        if not taken:
            log.warning("control of %s runs beside another step (lock wait over)", objective_id)
        started = time.thread_time()
        result = _control_step(queue, reads, objective_id)
        # This thread's CPU for the step (the control job's result: what the bench sums per task).
        return replace(result, cpu_ms=round((time.thread_time() - started) * 1000, 3))


def _control_step(queue: Queue, reads: Reads, objective_id: str) -> StepResult:
    """Read, decide (``control.decide``), act, append — re-decided from a fresh read whenever the
    objective moved under the decision, or a task's job turned out to be another's."""
    done = _StepCounts()

    def round_() -> StepResult:
        loaded, found = _read_for_step(reads, objective_id)
        obj = loaded.objective
        decision = control.decide(obj, found)
        if not decision.events:
            return StepResult(obj, done.appended, done.enqueued, done.canceled, done.ended)
        # Actions first: each is idempotent, so a re-decided step may repeat them harmlessly.
        adopted_foreign = False
        if decision.enqueue:
            deps = sorted({d for t in decision.enqueue for d in decision.state.tasks[t].depends_on})
            # A dependency settled in this very decision is not stored yet: take its result from the
            # decided state; the rest (settled earlier) from their rows.
            known = {d: decision.state.tasks[d].result for d in deps if d in decision.state.tasks}
            with reads() as conn:
                results = storage.task_results(conn, objective_id, [d for d in deps if d not in known])
            results.update(known)
            for task_id in decision.enqueue:
                task = decision.state.tasks[task_id]
                job = enqueue_task_job(queue, obj, task, control.task_payload(obj, task, results))
                adopted_foreign = adopted_foreign or not control.owns(obj, task, job)
                done.enqueued += 1
        for c in decision.cancel:
            try:
                queue.cancel(c.job_id, c.reason)
                done.canceled += 1
            except ConflictError:
                pass  # settled meanwhile; its settlement requests control again
        with transaction(queue.engine) as conn:
            storage.lock(conn, objective_id)
            fresh = storage.load(conn, objective_id)
            if fresh is None:
                raise ObjectiveNotFound(objective_id)
            base = loaded
            if fresh.objective.seq != obj.seq:
                newer = storage.receipts_after(conn, objective_id, obj.seq)
                # Only new control requests arrived: the decision still holds; append on top of them.
                if any(r.type != "objective.control_requested" for r in newer):
                    raise AppendConflict(f"objectives/{objective_id} moved past seq {obj.seq}")
                base = replace(fresh, objective=replace(fresh.objective, tasks=obj.tasks))
            after = storage.apply(conn, base, objective_id, decision.events, at=db_now(conn))
        done.appended += len(decision.events)
        done.ended = done.ended or decision.ended
        if decision.ended is not None:
            try:
                ensure_audit_job(queue, after.objective)
            except Exception:  # the outbox redrive queues audits that were missed
                log.exception("could not queue the audit of %s", objective_id)
        if after.objective.pending:
            _fast_path(queue, objective_id, known=after.objective)
        if adopted_foreign:
            # The decision counted on a job that is not its task's: decide again from what is stored.
            raise AppendConflict(f"objectives/{objective_id}: a task's job id is held by another job")
        return StepResult(after.objective, done.appended, done.enqueued, done.canceled, done.ended)

    return optimistic(round_, what=f"control of {objective_id}")


@dataclass
class _StepCounts:
    """What one control step did across its rounds."""

    appended: int = 0
    enqueued: int = 0
    canceled: int = 0
    ended: str | None = None


# -- recovery passes ----------------------------------------------------------------------------------


def redrive_outbox(queue: Queue, *, limit: int = 500, audit_grace_ms: int = 5000) -> dict[str, Any]:
    """Enqueue a control job for every unconsumed request that has none, and the audit of every
    ended objective whose audit job was lost. Idempotent: existing jobs are left alone.

    ``waiting`` lists the control jobs (existing or new) still queued, for the caller to deliver
    if their own wake-up was lost."""
    with queue.engine.connect() as conn:
        pending = storage.with_pending(conn, limit)
        unaudited = storage.unaudited(conn, audit_grace_ms, limit)
    controls: list[str] = []
    waiting: list[Job] = []
    for objective_id in pending:
        job = ensure_control_job(queue, objective_id)
        if job is not None:
            controls.append(job.id)
            if job.status == "queued":
                waiting.append(job)
    audits: list[str] = []
    for objective_id in unaudited:
        obj = get(queue.engine, objective_id, all_tasks=False)
        if obj is not None:
            job = ensure_audit_job(queue, obj)
            if job is not None and not job.terminal:
                audits.append(job.id)
    return {"objectives": len(pending), "controlJobs": controls, "auditJobs": audits, "waiting": waiting}


def resume(queue: Queue, *, page_size: int = 200) -> int:
    """Write a ``resume`` control request for every active objective, a page at a time."""
    after: str | None = None
    count = 0
    while True:
        with queue.engine.connect() as conn:
            ids = storage.active_ids(conn, after, page_size)
        if not ids:
            return count
        for objective_id in ids:
            if request(queue, objective_id, "resume"):
                count += 1
        after = ids[-1]


def run_audit(queue: Queue, objective_id: str) -> dict[str, Any]:
    """Compute the terminal audit and append it as ``objective.audited`` (once)."""
    obj = get(queue.engine, objective_id)
    if obj is None:
        raise ObjectiveNotFound(objective_id)
    if not obj.terminal:
        raise ConflictError(f"objective {objective_id} is still {obj.status}; it is audited once it ends")
    if obj.audit is not None:
        report: dict[str, Any] = obj.audit
        return report
    job_ids = [t.job_id for t in obj.tasks.values() if t.job_id]
    found = read_jobs(queue.engine, job_ids)
    streams = [objective_stream(objective_id)] + [
        job_stream(j) for j in sorted(found) if found[j] is not None
    ]
    broken: dict[str, str] = {}
    with queue.engine.connect() as conn:
        for stream in streams:
            _checked, brk = store.verify(conn, stream=stream)
            if brk is not None:
                broken[stream] = brk.reason
    report = audit.report(obj, found, broken, len(streams))

    def attempt() -> dict[str, Any]:
        with transaction(queue.engine) as conn:
            storage.lock(conn, objective_id)
            loaded = storage.load(conn, objective_id)
            assert loaded is not None
            if loaded.objective.audit is not None:
                existing: dict[str, Any] = loaded.objective.audit
                return existing
            storage.apply(
                conn, loaded, objective_id, [("objective.audited", {"report": report})], at=db_now(conn)
            )
        return report

    return optimistic(attempt, what=f"appending the audit of {objective_id}")
