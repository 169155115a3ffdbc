"""The Factory's kinds' handlers (agents ``factory``, ``factory-control`` and ``factory-monitor`` in
the kinds table): thin adapters over ``app.factory.service``.

- ``factory.dispatch`` launches ``payload.objective`` (idempotent by objectiveId); ``factory.run``
  has a planner turn the goal into a plan, then the same launch.
- ``factory.objective.control`` runs one control step, ``factory.objective.audit`` the terminal
  audit and ``factory.objective.watchdog`` one watchdog pass (``app.factory.sweep``).
- ``factory.task.monitor`` (``app.factory.monitor``) follows a computer-path task's job until it is
  terminal, reporting liveness as ``job.progress``.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from app.factory import monitor, service, sweep
from app.factory.plan import validate_objective
from app.factory.planner import PlannerRefused, load_planner
from app.jobs import kinds
from app.jobs.errors import ConflictError, ValidationError
from app.storage.db import db_now
from workers.handler import HandlerError, JobContext
from workers.kinds import handles


def _refuse(message: str) -> HandlerError:
    return HandlerError(message, retryable=False)


def _launch(ctx: JobContext, body: Any) -> dict[str, Any]:
    auth = ctx.payload.get("authContext")
    auth_context = auth if isinstance(auth, Mapping) else None
    try:
        spec = validate_objective(body, auth_context=auth_context)
    except ValidationError as exc:
        raise _refuse(f"invalid objective: {exc.message}") from None
    org = ctx.job.organization_id
    if spec.organization_id != org:
        raise _refuse("objective.authContext.organizationId must be the job's organisation")
    result = service.launch(ctx.queue, spec, launched_by=service.launcher_from(ctx.job.enqueued_by))
    obj = result.objective
    if obj.organization_id != org:
        raise _refuse("that objectiveId cannot be used; choose another")
    # The objective as its organisation knows it (the key is storage's), as the API answers name it.
    return {
        "objectiveId": obj.client_id,
        "created": result.created,
        "status": obj.status,
        "stream": obj.stream,
    }


@handles(kinds.DISPATCH)
def dispatch(ctx: JobContext) -> Any:
    objective = ctx.payload.get("objective")
    if not isinstance(objective, Mapping):
        raise _refuse("factory.dispatch needs payload.objective: the same shape as POST /objectives")
    return _launch(ctx, objective)


@handles(kinds.RUN)
def run(ctx: JobContext) -> Any:
    try:
        body = load_planner(ctx.settings).plan(ctx.payload)
    except PlannerRefused as exc:
        raise _refuse(str(exc)) from None
    return _launch(ctx, body)


def _objective_id(ctx: JobContext) -> str:
    """The key of the objective the payload names, in the job's own organisation.

    Another organisation's objective is not looked at: it is exactly as absent as a missing one,
    and refused with the same error (``ObjectiveNotFound``), so a job learns nothing about it.
    """
    objective_id = ctx.payload.get("objectiveId")
    if not isinstance(objective_id, str) or not objective_id:
        raise _refuse(f"{ctx.job.kind} needs payload.objectiveId")
    return service.key_of(ctx.queue.engine, ctx.job.organization_id, objective_id)


@handles(kinds.CONTROL)
def control(ctx: JobContext) -> Any:
    try:
        return service.control_step(ctx.queue, _objective_id(ctx)).to_json()
    except service.ObjectiveNotFound:
        raise _refuse(no_objective(ctx)) from None
    except ConflictError as exc:
        raise _refuse(str(exc)) from None


@handles(kinds.AUDIT)
def audit(ctx: JobContext) -> Any:
    try:
        return service.run_audit(ctx.queue, _objective_id(ctx))
    except service.ObjectiveNotFound:
        raise _refuse(no_objective(ctx)) from None
    except ConflictError as exc:
        raise _refuse(str(exc)) from None


@handles(kinds.WATCHDOG)
def watchdog(ctx: JobContext) -> Any:
    return sweep.watchdog_pass(ctx.queue, ctx.settings)


def no_objective(ctx: JobContext) -> str:
    """The one refusal for an objective the job's organisation does not have (missing or foreign)."""
    return f"no objective {ctx.payload.get('objectiveId')!r} in this job's organisation"


@handles(kinds.MONITOR)
def follow_task(ctx: JobContext) -> Any:
    try:
        objective_id = _objective_id(ctx)
    except service.ObjectiveNotFound:
        raise _refuse(no_objective(ctx)) from None
    client_task_job_id = ctx.payload.get("taskJobId")
    if not isinstance(client_task_job_id, str) or not client_task_job_id:
        raise _refuse("factory.task.monitor needs payload.taskJobId")
    # The task's job as the job's own organisation knows it (another's is exactly as absent).
    task_job = ctx.queue.find(ctx.job.organization_id, client_task_job_id)
    if task_job is None:
        raise _refuse(f"no job {client_task_job_id!r} in this job's organisation")
    task_job_id = task_job.id

    def now() -> datetime:
        with ctx.queue.engine.connect() as conn:
            return db_now(conn)

    return monitor.follow(
        task_job_id,
        ctx.settings,
        get_job=ctx.queue.get,
        now=now,
        report=ctx.progress,
        wait=ctx.wait_cancelled,
        request_reconcile=lambda detail: service.request(ctx.queue, objective_id, "reconcile", detail),
    )
