"""Objective endpoints (the Factory): launch, read, list, cancel, follow.

Same auth, tenancy, error shape and OpenAPI as jobs: an objective belongs to its
``authContext.organizationId`` and its ``objectiveId`` is unique within that organisation only, so
another organisation's objective of the same id is simply not there (404 like an unknown one;
launching that id launches the caller's own).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

from flask import Blueprint, request
from flask.typing import ResponseReturnValue
from sqlalchemy.engine import Engine

from api import auth, inputs, schemas, sse
from api.context import read_connection, state
from api.errors import ApiError, archived, forbidden
from api.following import held_stream, resume_point, sse_timing
from api.objective_view import ObjectiveView, objective_json, overlaid_jobs
from api.objective_view import task_json as task_json
from api.openapi import Operation, operation
from api.watch import StreamPoller, Subscription
from app.factory import ledger, service, storage
from app.factory.plan import TaskSpec, validate_objective
from app.factory.reducer import Objective, reduce
from app.factory.vocab import (
    OBJECTIVE_STREAM_PREFIX,
    objective_stream,
)
from app.jobs.errors import ValidationError
from app.jobs.reducer import Job
from app.jobs.vocab import job_id_of, job_stream
from app.storage import store

log = logging.getLogger("receipt.api")
blueprint = Blueprint("objectives", __name__)

OBJECTIVE_NOT_FOUND_MESSAGE = "no objective with that id"
_PATH = {"objectiveId": schemas.OBJECTIVE_ID_PARAM}


def objective_not_found() -> ApiError:
    return ApiError(404, "not_found", OBJECTIVE_NOT_FOUND_MESSAGE)


def live_json(obj: Objective) -> dict[str, Any]:
    """The objective with its unfinished tasks' live job state overlaid (one query)."""
    active = list(overlaid_jobs(obj))
    return objective_json(obj, service.read_jobs(state().engine, active) if active else {})


def visible_objective(objective_id: str) -> Objective:
    """The objective (every task) its organisation knows as ``objective_id``, in the organisation
    this route acts in; otherwise the one 404 (another's of the same id is exactly as absent)."""
    org = auth.scoped_organization()
    obj = service.find(state().engine, org, objective_id)
    if obj is None:
        gone = service.archived(state().engine, org, objective_id)
        if gone is not None:
            raise archived(gone.to_json())
    if obj is None or not auth.current().may_act_for(obj.organization_id):
        raise objective_not_found()
    return obj


def _objective_path(obj: Objective, suffix: str = "") -> str:
    """Where the objective's organisation reads it; a system token acting in another organisation
    names it (``?organizationId=``)."""
    path = f"{request.script_root}/objectives/{obj.client_id}{suffix}"
    if obj.organization_id not in (None, auth.current().organization_id):
        path += "?" + urlencode({schemas.ORGANIZATION_PARAM: obj.organization_id})
    return path


@blueprint.post("/objectives")
@operation(
    Operation(
        summary="Launch an objective: a plan (a DAG of tasks) run as jobs by objective control.",
        description="Validates the whole plan before writing anything (a cycle, an unknown dependency, a "
        "duplicate task id, an empty plan, more than 1000 tasks, a kind that cannot be a task, or a task "
        "payload the job validation refuses are each a 400 naming the problem). Re-posting an existing "
        "objectiveId returns that objective unchanged; an archived one answers 410 with its summary "
        "and writes nothing.",
        tag="objectives",
        body=schemas.OBJECTIVE_REQUEST,
        responses={202: schemas.OBJECTIVE_LAUNCH_RESPONSE},
        errors=(403, 409, 410, 429),
    )
)
def launch(body: dict[str, Any]) -> ResponseReturnValue:
    identity = auth.current()
    ctx = body.get("authContext")
    default_ctx = None
    if ctx is None:
        # Unset: the objective belongs to the token's own organisation (a system token's too).
        if identity.organization_id is None:
            raise ValidationError(
                "authContext", "is required without a token and must carry userId and organizationId"
            )
        default_ctx = {"userId": f"token:{identity.token_id}", "organizationId": identity.organization_id}
    spec = validate_objective(body, auth_context=default_ctx)
    if not identity.may_act_for(spec.organization_id):
        raise forbidden("authContext.organizationId is not the organisation of this token")
    for task in spec.tasks:
        # A task that runs a command needs the same right as posting that job directly.
        auth.require_command_scope(identity, task.agent_id, task.kind, task.payload)
    result = service.launch(state().queue, spec, launched_by=identity.enqueuer().to_json())
    obj = result.objective
    if not result.created:
        obj = service.get(state().engine, obj.id) or obj  # with every task
    headers = {"Location": _objective_path(obj)}
    out = {
        "objective": live_json(obj),
        "async": {
            "objectiveId": obj.client_id,
            "stream": obj.stream,
            "eventsUrl": _objective_path(obj, "/events"),
        },
    }
    return out, 202, headers


@blueprint.get("/objectives/<objectiveId>")
@operation(
    Operation(
        summary="Read one objective with every task's status, job, attempt, result and error.",
        tag="objectives",
        path=_PATH,
        responses={200: schemas.OBJECTIVE_RESPONSE},
        errors=(410,),
        scoped=True,
    )
)
def get_objective(objectiveId: str) -> ResponseReturnValue:
    found = visible_objective(objectiveId)
    obj = live_json(found)
    try:
        with read_connection(state().engine) as conn:
            obj["ledger"] = ledger.summary(conn, found.id)
    except Exception:  # the ledger is best effort: its absence never fails the read
        log.warning("ledger summary of %s unavailable", found.id, exc_info=True)
        obj["ledger"] = None
    return {"objective": obj}


@blueprint.get("/objectives")
@operation(
    Operation(
        summary="List objectives, newest first.",
        description="A system token lists every organisation unless organizationId is given.",
        tag="objectives",
        query=schemas.LIST_OBJECTIVES_QUERY,
        responses={200: schemas.OBJECTIVE_PAGE},
        errors=(403,),
    )
)
def list_objectives(query: dict[str, Any]) -> ResponseReturnValue:
    scope = auth.listing_scope(query.get("organizationId"))
    cursor = inputs.checked_cursor(query.get("cursor"))
    engine = state().engine
    with read_connection(engine) as conn:
        page = storage.list_page(
            conn, **scope, status=query.get("status"), limit=query["limit"], cursor=cursor
        )
    out = []
    for header in page.objectives:
        full = service.get(engine, header.id)
        if full is not None:
            out.append(live_json(full))
    return {"objectives": out, "nextCursor": page.next_cursor}


@blueprint.post("/objectives/<objectiveId>/cancel")
@operation(
    Operation(
        summary="Cancel an objective.",
        description="Pending tasks never start; running task jobs get an abort command; the objective "
        "ends canceled once none is running. A terminal objective answers 409.",
        tag="objectives",
        path=_PATH,
        body=schemas.CANCEL_REQUEST,
        body_required=False,
        responses={202: schemas.OBJECTIVE_RESPONSE},
        errors=(409, 410, 429),
        scoped=True,
    )
)
def cancel(objectiveId: str, body: dict[str, Any]) -> ResponseReturnValue:
    key = visible_objective(objectiveId).id
    service.cancel(state().queue, key, body.get("reason"))
    return {"objective": live_json(visible_objective(objectiveId))}, 202


@blueprint.post("/objectives/<objectiveId>/plan")
@operation(
    Operation(
        summary="Replan an objective: start phase n+1 with a new plan.",
        description="The plan is validated as at launch (400 naming the field, nothing written); its task "
        "ids must be new to the objective. Control cancels the earlier phases' queued jobs, sends their "
        "running jobs an abort command (reason `phase superseded`), then runs the new phase. Earlier "
        "phases' tasks stay in GET with their phase. A terminal or canceling objective answers 409.",
        tag="objectives",
        path=_PATH,
        body=schemas.REPLAN_REQUEST,
        responses={202: schemas.OBJECTIVE_RESPONSE},
        errors=(400, 403, 409, 410, 429),
        scoped=True,
    )
)
def replan(objectiveId: str, body: dict[str, Any]) -> ResponseReturnValue:
    current = visible_objective(objectiveId)
    identity = auth.current()

    def authorize(tasks: Sequence[TaskSpec]) -> None:
        # A new task that runs a command needs the same right as at launch.
        for task in tasks:
            auth.require_command_scope(identity, task.agent_id, task.kind, task.payload)

    service.replan(state().queue, current.id, body.get("tasks"), body.get("reason"), authorize)
    return {"objective": live_json(visible_objective(objectiveId))}, 202


def follow(
    engine: Engine,
    poller: StreamPoller,
    objective_id: str,
    after: int,
    timing: sse.Timing,
    token_id: str | None = None,
) -> Iterator[str]:
    """SSE frames: a snapshot, then one small delta per objective receipt and the live overlay.

    Ends once the objective ended and its audit was sent. A client that resumes (Last-Event-ID)
    gets a fresh snapshot at the current head first (nothing between is lost: the snapshot is
    the state after it), unless it already saw the end. Runs after the view returned (no request
    or app context): everything comes in as arguments.
    """
    stream = objective_stream(objective_id)
    pacer = sse.Pacer(timing)
    yield pacer.retry_frame()
    try:
        obj = service.get(engine, objective_id)
        jobs: dict[str, Job | None] = service.read_jobs(engine, overlaid_jobs(obj)) if obj else {}
    except Exception:
        log.warning(
            "objective event stream %s could not start: storage read failed", objective_id, exc_info=True
        )
        yield sse.STORAGE_UNAVAILABLE
        return
    if obj is None or (_finished(obj) and after >= obj.seq):
        return
    view = ObjectiveView()
    yield sse.format_event("objective", obj.seq, view.snapshot(obj, jobs))
    if _finished(obj):
        return
    watched = {job_stream(j.id): j.seq for j in jobs.values() if j is not None}
    watched.update({job_stream(j): 0 for j in overlaid_jobs(obj) if job_stream(j) not in watched})
    with sse.subscribed(poller, {stream: obj.seq, **watched}, token_id) as sub:
        backlog = False
        while True:
            if (end := sse.ended(sub)) is not None:
                yield end
                return
            advanced = sub.advanced()
            started = [job_id_of(s) for s in advanced if s != stream]
            try:
                batch = []
                if backlog or stream in advanced:
                    with read_connection(engine) as conn:
                        batch = store.read_stream(conn, stream, after=obj.seq, limit=sse.BATCH)
                    backlog = len(batch) == sse.BATCH
                if started:
                    jobs.update(service.read_jobs(engine, started))
            except Exception:
                log.warning(
                    "objective event stream %s ended: storage read failed", objective_id, exc_info=True
                )
                yield sse.STORAGE_UNAVAILABLE
                return
            for receipt in batch:
                before = obj
                obj = reduce(obj, receipt.to_receipt()) or before
                yield sse.format_event("delta", obj.seq, view.after_receipt(before, obj, receipt.type, jobs))
            sub.read_up_to(stream, obj.seq)
            for job_id in started:
                job = jobs.get(job_id)
                if job is not None:
                    sub.read_up_to(job_stream(job_id), job.seq)
            # Follow exactly the jobs whose lease the overlay shows (only queued/running tasks).
            by_job = overlaid_jobs(obj)
            _rewatch(sub, by_job, jobs)
            changed = view.overlay(obj, [by_job[j] for j in started if j in by_job], jobs)
            if changed:
                yield sse.format_event("task", None, {"tasks": changed})
            if _finished(obj):
                return
            if backlog:
                continue
            yield from pacer.idle(sub)
            if pacer.expired:
                return


def _finished(obj: Objective) -> bool:
    """Nothing more will be appended that the stream shows: ended, and its audit is in."""
    return obj.terminal and obj.audit is not None


def _rewatch(sub: Subscription, by_job: Mapping[str, str], jobs: dict[str, Job | None]) -> None:
    for job_id in [j for j in jobs if j not in by_job]:
        del jobs[job_id]
        sub.unwatch(job_stream(job_id))
    for job_id in by_job:
        if job_id not in jobs:
            jobs[job_id] = None
            sub.watch(job_stream(job_id), 0)


@blueprint.get("/objectives/<objectiveId>/events")
@operation(
    Operation(
        summary="Follow an objective as Server-Sent Events: a snapshot, then what changed.",
        description="The first event is the objective as GET shows it, live running overlay included "
        "(event: objective, id: seq). Then one small event per objective receipt (event: delta, id: seq: "
        "its type, the tasks that changed, and status, phase or audit when they changed), and event: task "
        "(no id) when a queued task's job starts running. Resuming with Last-Event-ID sends a fresh "
        "snapshot at the current head. Ends once the objective ended and its audit was sent.",
        tag="objectives",
        path=_PATH,
        query=schemas.EVENTS_QUERY,
        headers={"Last-Event-ID": schemas.LAST_EVENT_ID_HEADER},
        responses={200: schemas.OBJECTIVE_EVENT},
        errors=(410,),
        streams=True,
        scoped=True,
    )
)
def objective_events(objectiveId: str, query: dict[str, Any]) -> ResponseReturnValue:
    key = visible_objective(objectiveId).id
    after = resume_point(query)
    st = state()
    engine, poller, timing = st.engine, st.poller, sse_timing()
    return held_stream(lambda token_id: follow(engine, poller, key, after, timing, token_id))


def readable_objective_stream(stream: str) -> bool:
    """For ``/streams/objectives/<key>/...``: True (after the 404 check) when it is an objective
    stream. The stream name carries the key, so the objective is read by it and its organisation
    checked (another organisation's stream is the same 404 as a missing one)."""
    if not stream.startswith(OBJECTIVE_STREAM_PREFIX):
        return False
    obj = service.get(state().engine, stream[len(OBJECTIVE_STREAM_PREFIX) :], all_tasks=False)
    if obj is None or not auth.current().may_act_for(obj.organization_id):
        raise objective_not_found()
    return True
