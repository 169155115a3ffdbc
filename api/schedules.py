"""Schedule endpoints: declare, list, read, change, pause, resume, delete, trigger, backfill, fires.

Same auth, tenancy, error shape and OpenAPI as jobs: a schedule belongs to its job template's
``authContext.organizationId``, its ``scheduleId`` is unique within that organisation only, and
another organisation's schedule of the same id is simply not there (404 like an unknown one;
declaring that id declares the caller's own). A system token names another organisation with
``?organizationId=``. Declaring or changing a job template needs the right to post that job
(``api.auth.require_enqueue_allowed``: its kind's rule, the organisation, the ``commands`` scope),
because every tick posts it with the declarer's rights.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlencode

from flask import Blueprint, request
from flask.typing import ResponseReturnValue

from api import auth, inputs, schemas
from api.context import read_connection, state
from api.errors import ApiError, forbidden
from api.jobs import require_own_objective
from api.openapi import Operation, operation
from api.present import job_json
from api.schemas import schedules as schedule_schemas
from app.jobs.errors import ValidationError
from app.jobs.times import iso
from app.schedules import service, storage
from app.schedules.reducer import Schedule
from app.schedules.spec import Spec, validate_create

blueprint = Blueprint("schedules", __name__)

SCHEDULE_NOT_FOUND_MESSAGE = "no schedule with that id"
_PATH = {"scheduleId": schedule_schemas.SCHEDULE_ID_PARAM}


def schedule_not_found() -> ApiError:
    return ApiError(404, "not_found", SCHEDULE_NOT_FOUND_MESSAGE)


def schedule_json(s: Schedule) -> dict[str, Any]:
    """The schedule as its organisation sees it: its declaration flattened, where it stands."""
    spec = s.spec.to_json()
    next_at = storage.next_fire_at(s)
    return {
        "id": s.client_id,
        "organizationId": s.organization_id,
        "stream": s.stream,
        "status": s.status,
        "pausedReason": s.paused_reason,
        **spec,
        "nextFireAt": iso(next_at),
        "bufferedTick": s.buffered_tick,
        "lastJobId": s.last_job_id.rpartition("/")[2] if s.last_job_id else None,
        "lastOutcome": s.last_outcome.to_json() if s.last_outcome else None,
        "counts": s.counts.to_json(),
        "createdAt": s.created_at,
        "updatedAt": s.updated_at,
        "seq": s.seq,
    }


def visible_schedule(schedule_id: str) -> Schedule:
    """The schedule its organisation knows as ``schedule_id``, in the organisation this route acts
    in; otherwise the one 404."""
    found = service.find(state().engine, auth.scoped_organization(), schedule_id)
    if found is None or not auth.current().may_act_for(found.organization_id):
        raise schedule_not_found()
    return found


def _schedule_path(s: Schedule, suffix: str = "") -> str:
    path = f"{request.script_root}/schedules/{s.client_id}{suffix}"
    if s.organization_id != auth.current().organization_id:
        path += "?" + urlencode({schemas.ORGANIZATION_PARAM: s.organization_id})
    return path


def _default_auth(organization_id: str | None) -> dict[str, Any] | None:
    """The authContext a template without one gets: the caller's token, in ``organization_id``."""
    if organization_id is None:
        return None
    return {"userId": f"token:{auth.current().token_id}", "organizationId": organization_id}


def _require_may_post(spec: Spec, organization_id: str) -> None:
    """Every tick posts the template with the declarer's rights: it must be a job they may post."""
    identity = auth.current()
    if not identity.may_act_for(organization_id):
        raise forbidden("job.payload.authContext.organizationId is not the organisation of this token")
    req = spec.job.request("", None)  # only its agent, kind, organisation and objective are read
    auth.require_enqueue_allowed(identity, spec.job.agent_id, req)
    require_own_objective(req)


def _missing(exc: service.ScheduleNotFound) -> ApiError:
    return schedule_not_found()


T = TypeVar("T")


def _acting(schedule_id: str, act: Callable[[str], T]) -> T:
    """``act`` on the schedule this caller knows as ``schedule_id``: the 404 when it is not theirs,
    or when it went between the read and the act (deleted meanwhile)."""
    s = visible_schedule(schedule_id)
    try:
        return act(s.id)
    except service.ScheduleNotFound as exc:
        raise _missing(exc) from None


@blueprint.post("/schedules")
@operation(
    Operation(
        summary="Declare a schedule: a cron (optional seconds field, IANA zone) or an interval, a job "
        "template, an overlap policy and a catch-up window.",
        description="Every tick enqueues the template under the job id <scheduleId>:<tick> in the "
        "schedule's organisation, so a tick is one job however many beats or retries decide it. "
        "Re-posting an existing scheduleId returns that schedule unchanged (200); a new one is 201.",
        tag="schedules",
        body=schedule_schemas.SCHEDULE_CREATE,
        responses={201: schedule_schemas.SCHEDULE_RESPONSE, 200: schedule_schemas.SCHEDULE_RESPONSE},
        errors=(403, 409, 429),
    )
)
def create(body: dict[str, Any]) -> ResponseReturnValue:
    identity = auth.current()
    template = body.get("job") or {}
    payload = template.get("payload") if isinstance(template, dict) else None
    named = payload.get("authContext") if isinstance(payload, dict) else None
    if named is None and identity.organization_id is None:
        raise ValidationError(
            "job.payload.authContext", "is required without a token and must carry userId and organizationId"
        )
    declared = validate_create(body, default_auth=_default_auth(identity.organization_id))
    _require_may_post(declared.spec, declared.organization_id)
    result = service.create(state().queue, declared, enqueued_by=identity.enqueuer())
    headers = {"Location": _schedule_path(result.schedule)}
    return {"schedule": schedule_json(result.schedule)}, 201 if result.created else 200, headers


@blueprint.get("/schedules")
@operation(
    Operation(
        summary="List schedules, newest first, with each one's next fire time and last outcome.",
        description="A system token lists every organisation unless organizationId is given. Deleted "
        "schedules only with status=deleted.",
        tag="schedules",
        query=schedule_schemas.LIST_SCHEDULES_QUERY,
        responses={200: schedule_schemas.SCHEDULE_PAGE},
        errors=(403,),
    )
)
def list_schedules(query: dict[str, Any]) -> ResponseReturnValue:
    scope = auth.listing_scope(query.get("organizationId"))
    cursor = inputs.checked_cursor(query.get("cursor"))
    with read_connection(state().engine) as conn:
        page = storage.list_page(
            conn, **scope, status=query.get("status"), limit=query["limit"], cursor=cursor
        )
    return {"schedules": [schedule_json(s) for s in page.schedules], "nextCursor": page.next_cursor}


@blueprint.get("/schedules/<scheduleId>")
@operation(
    Operation(
        summary="Read one schedule.",
        tag="schedules",
        path=_PATH,
        responses={200: schedule_schemas.SCHEDULE_RESPONSE},
        scoped=True,
    )
)
def get_schedule(scheduleId: str) -> ResponseReturnValue:
    return {"schedule": schedule_json(visible_schedule(scheduleId))}


@blueprint.patch("/schedules/<scheduleId>")
@operation(
    Operation(
        summary="Change a schedule: the fields given replace the current ones (null clears one).",
        description="A change of when it ticks (cron, intervalMs, timeZone, startAt, endAt) restarts "
        "it from now: ticks before the change are not owed. The same values again change nothing.",
        tag="schedules",
        path=_PATH,
        body=schedule_schemas.SCHEDULE_PATCH,
        responses={200: schedule_schemas.SCHEDULE_RESPONSE},
        errors=(403, 429),
        scoped=True,
    )
)
def update(scheduleId: str, body: dict[str, Any]) -> ResponseReturnValue:
    s = visible_schedule(scheduleId)
    identity = auth.current()
    try:
        done = service.update(
            state().queue,
            s.id,
            body,
            enqueued_by=identity.enqueuer(),
            default_auth=_default_auth(s.organization_id),
            check=lambda spec: _require_may_post(spec, s.organization_id),
        )
    except service.ScheduleNotFound as exc:
        raise _missing(exc) from None
    return {"schedule": schedule_json(done)}


@blueprint.delete("/schedules/<scheduleId>")
@operation(
    Operation(
        summary="Delete a schedule: no more ticks. Its receipts and the jobs it fired stay.",
        tag="schedules",
        path=_PATH,
        responses={200: schedule_schemas.SCHEDULE_RESPONSE},
        errors=(429,),
        scoped=True,
    )
)
def delete(scheduleId: str) -> ResponseReturnValue:
    done = _acting(scheduleId, lambda key: service.delete(state().queue, key))
    return {"schedule": schedule_json(done)}


@blueprint.post("/schedules/<scheduleId>/pause")
@operation(
    Operation(
        summary="Pause a schedule (already paused: unchanged).",
        tag="schedules",
        path=_PATH,
        body=schedule_schemas.REASON_REQUEST,
        body_required=False,
        responses={200: schedule_schemas.SCHEDULE_RESPONSE},
        errors=(429,),
        scoped=True,
    )
)
def pause(scheduleId: str, body: dict[str, Any]) -> ResponseReturnValue:
    done = _acting(scheduleId, lambda key: service.pause(state().queue, key, body.get("reason")))
    return {"schedule": schedule_json(done)}


@blueprint.post("/schedules/<scheduleId>/resume")
@operation(
    Operation(
        summary="Resume a paused schedule from now (the ticks it missed while paused are not owed: "
        "backfill them).",
        tag="schedules",
        path=_PATH,
        body=schedule_schemas.NO_BODY,
        body_required=False,
        responses={200: schedule_schemas.SCHEDULE_RESPONSE},
        errors=(429,),
        scoped=True,
    )
)
def resume(scheduleId: str, body: dict[str, Any]) -> ResponseReturnValue:
    done = _acting(scheduleId, lambda key: service.resume(state().queue, key))
    return {"schedule": schedule_json(done)}


@blueprint.post("/schedules/<scheduleId>/trigger")
@operation(
    Operation(
        summary="Fire a tick now (job id <scheduleId>:<now, to the millisecond>), under the overlap "
        "policy: skip and bufferOne skip it while the previous job is active.",
        tag="schedules",
        path=_PATH,
        body=schedule_schemas.TRIGGER_REQUEST,
        body_required=False,
        responses={202: schedule_schemas.TRIGGER_RESPONSE},
        errors=(429,),
        scoped=True,
    )
)
def trigger(scheduleId: str, body: dict[str, Any]) -> ResponseReturnValue:
    done = _acting(scheduleId, lambda key: service.trigger(state().queue, key, body.get("overlap")))
    job = job_json(done.job) if done.job is not None else None
    return {"outcome": done.outcome, "job": job, "schedule": schedule_json(done.schedule)}, 202


@blueprint.post("/schedules/<scheduleId>/backfill")
@operation(
    Operation(
        summary="Fire every tick of a past time range once, under the ids the schedule's own ticks use, "
        "so a repeated backfill is a no-op.",
        tag="schedules",
        path=_PATH,
        body=schedule_schemas.BACKFILL_REQUEST,
        responses={200: schedule_schemas.BACKFILL_RESPONSE},
        errors=(429,),
        scoped=True,
    )
)
def backfill(scheduleId: str, body: dict[str, Any]) -> ResponseReturnValue:
    done = _acting(
        scheduleId, lambda key: service.backfill(state().queue, key, body["startAt"], body["endAt"])
    )
    return {
        "created": [job_json(j) for j in done.created],
        "existing": [j.client_id for j in done.existing],
        "schedule": schedule_json(done.schedule),
    }


@blueprint.get("/schedules/<scheduleId>/fires")
@operation(
    Operation(
        summary="The schedule's tick receipts, newest first: fired (with its job as it is now), missed, "
        "skipped and buffered.",
        tag="schedules",
        path=_PATH,
        query=schedule_schemas.FIRES_QUERY,
        responses={200: schedule_schemas.FIRES_PAGE},
        scoped=True,
    )
)
def fires(scheduleId: str, query: dict[str, Any]) -> ResponseReturnValue:
    s = visible_schedule(scheduleId)
    limit = query["limit"]
    records = service.fires(state().engine, s.id, before=query.get("before"), limit=limit)
    out = []
    for r in records:
        item: dict[str, Any] = {
            "seq": r.seq,
            "type": r.type,
            "at": r.at,
            "tick": r.body.get("tick"),
            "jobId": r.body.get("jobId"),
            **schedule_schemas.body_of(dict(r.body)),
            "job": job_json(r.job) if r.job is not None else None,
        }
        item["jobStatus"] = r.job.status if r.job is not None else None
        out.append(item)
    next_before = records[-1].seq if len(records) == limit else None
    return {"fires": out, "nextBefore": next_before}
