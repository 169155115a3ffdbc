"""Job endpoints: enqueue, read, list, send commands, cancel, replay, bulk actions and their progress,
the dead letters.

Every operation acts in one organisation (``api.auth``): a client's ``jobId`` is unique within its
organisation only, so another organisation's job of the same id is simply not there — reading it
is the same 404 as an unknown id, and posting that id creates the caller's own job. A system token
names another organisation with ``?organizationId=``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from flask import Blueprint
from flask.typing import ResponseReturnValue

from api import auth, inputs, limits, schemas
from api.context import read_connection, state
from api.errors import NOT_FOUND, ApiError, archived, forbidden, job_not_found
from api.openapi import Operation, operation
from api.present import async_block, job_json, job_path, with_waiting
from app.factory import service
from app.jobs import replay as replays
from app.jobs.errors import ValidationError
from app.jobs.flow import FLOW_FIELDS
from app.jobs.reducer import Job
from app.jobs.validation import EnqueueRequest, command_lane, validate_enqueue
from app.ops import bulk_actions
from app.retention.sink import DirectorySink
from app.storage import search
from app.storage.db import iso, parse_iso
from app.storage.queue import Archived, encode_cursor

blueprint = Blueprint("jobs", __name__)

_JOB_PATH = {"jobId": schemas.JOB_ID_PARAM}
# Where a created job can be followed: every operation on it, fed the id and the organisation the
# response carries (a system token that posted for another organisation must name it).
_CREATED_JOB_ID = {"jobId": "$response.body#/job/id", "organizationId": "$response.body#/job/organizationId"}
_FOLLOW_THE_JOB = {
    "GetJob": ("jobs.get_job", _CREATED_JOB_ID),
    "SendCommand": ("jobs.send_command", _CREATED_JOB_ID),
    "CancelJob": ("jobs.cancel", _CREATED_JOB_ID),
    "ReplayJob": ("jobs.replay", _CREATED_JOB_ID),
    "FollowJobEvents": ("streams.job_events", _CREATED_JOB_ID),
    "ReadJobReceipts": ("streams.receipts", {"stream": "$response.body#/job/stream"}),
    "FollowJobReceipts": ("streams.stream_events", {"stream": "$response.body#/job/stream"}),
}


def visible_job(job_id: str) -> Job:
    """The job its organisation knows as ``job_id``, in the organisation this route acts in;
    otherwise the one 404 (another organisation's job of the same id is exactly as absent)."""
    org = auth.scoped_organization()
    job = state().queue.find(org, job_id)
    if job is None:
        gone = state().queue.archived(org, job_id)
        if gone is not None:
            raise archived(gone.to_json())
    if job is None or not auth.current().may_see(job):
        raise job_not_found()
    return job


def require_own_objective(req: EnqueueRequest) -> None:
    """A payload's objectiveId must name an objective of the job's own organisation: another's (or
    none) is the same 403, so the answer says nothing about other organisations' objectives."""
    objective_id = req.payload.get("objectiveId")
    if not isinstance(objective_id, str):
        return
    try:
        service.key_of(state().engine, req.organization_id, objective_id)
    except service.ObjectiveNotFound:
        raise forbidden("payload.objectiveId must name an objective of this organisation") from None


@blueprint.post("/agents/<agentId>/jobs")
@operation(
    Operation(
        summary="Enqueue a job for an agent.",
        description="Appends job.enqueued and returns 202 with the job and where to follow it. A jobId "
        "is unique within the organisation: re-posting one returns that job unchanged (an archived one: 410 "
        "with its summary, nothing written); the same id in "
        "another organisation is another job. singletonMode steer returns the steered job. Unknown "
        "agent ids are accepted. priority, concurrencyKey (with concurrencyLimit) and debounce shape "
        "when it is dispatched (docs/dispatch.md): a debounced enqueue waits windowMs and, in the same "
        "transaction, cancels the organisation's job still queued with the same debounce key "
        "(job.canceled, reason 'debounced').",
        tag="jobs",
        body=schemas.ENQUEUE_REQUEST,
        path={"agentId": schemas.AGENT_ID_PARAM},
        responses={202: schemas.ENQUEUE_RESPONSE},
        errors=(403, 409, 410, 429),
        links=_FOLLOW_THE_JOB,
    )
)
def enqueue(agentId: str, body: dict[str, Any]) -> ResponseReturnValue:
    req = validate_enqueue(agentId, body)
    identity = auth.current()
    auth.require_enqueue_allowed(identity, agentId, req)
    require_own_objective(req)
    result = state().queue.enqueue(req, enqueued_by=identity.enqueuer())
    job = result.job
    headers = {"Location": job_path(job)}
    return {"job": job_json(job), "async": async_block(job)}, 202, headers


@blueprint.post("/jobs:batch")
@operation(
    Operation(
        summary="Enqueue many jobs at once: one transaction, all or none.",
        description="Each item is a single enqueue's body plus its agentId. Every item is checked before "
        "anything is written: one invalid item refuses the whole request (400, or 403 for what the "
        "caller may not post), naming its index (items[<i>]), and nothing is written. Each item is "
        "idempotent by its jobId exactly as a single enqueue, singleton rules apply per item in "
        "order, and the answer lists every item's job. At most RECEIPT_BATCH_MAX items; each counts "
        "as one write against the organisation's write limit.",
        tag="jobs",
        body=schemas.BATCH_ENQUEUE_REQUEST,
        responses={202: schemas.BATCH_ENQUEUE_RESPONSE},
        errors=(403, 429),
    )
)
def enqueue_batch(body: dict[str, Any]) -> ResponseReturnValue:
    items: list[dict[str, Any]] = body["items"]
    cap = state().settings.batch_max
    if len(items) > cap:
        raise ValidationError(
            "items", f"holds {len(items)} jobs; a batch holds at most {cap} (RECEIPT_BATCH_MAX)"
        )
    limits.count_items(len(items))
    identity = auth.current()
    reqs = []
    for index, item in enumerate(items):
        where = f"items[{index}]"
        enqueue_body = {k: v for k, v in item.items() if k != "agentId"}
        try:
            req = validate_enqueue(item.get("agentId"), enqueue_body)
        except ValidationError as exc:
            raise ValidationError(f"{where}.{exc.field}", exc.reason, exc.allowed) from None
        try:
            auth.require_enqueue_allowed(identity, req.agent_id, req)
            require_own_objective(req)
        except ApiError as exc:
            details = {**(exc.details or {}), "index": index}
            raise ApiError(exc.status, exc.code, f"{where}: {exc.message}", details) from None
        reqs.append(req)
    results = state().queue.enqueue_many(reqs, enqueued_by=identity.enqueuer())
    jobs: list[dict[str, Any]] = []
    for i, r in enumerate(results):
        if isinstance(r, Archived):
            jobs.append({"index": i, "created": False, "steered": False, "archived": dict(r.summary)})
        else:
            jobs.append({"index": i, "created": r.created, "steered": r.steered, "job": job_json(r.job)})
    return {"jobs": jobs}, 202


@blueprint.get("/jobs/<jobId>")
@operation(
    Operation(
        summary="Read one job.",
        description="An archived job answers 410 with its summary (from its tombstone) and the "
        "archive segment holding its receipts.",
        tag="jobs",
        path=_JOB_PATH,
        responses={200: schemas.JOB_RESPONSE},
        errors=(410,),
        scoped=True,
    )
)
def get_job(jobId: str) -> ResponseReturnValue:
    job = visible_job(jobId)
    return {"job": with_waiting([job_json(job)], [job])[0]}


@blueprint.get("/jobs")
@operation(
    Operation(
        summary="List jobs, newest first.",
        description=(
            "Filters combine (organisation, agent, kind, status, lane, session, tag, error prefix, "
            "creation time range); a bad one is a 400 naming it. A system token lists every "
            "organisation unless organizationId is given. "
            "A page stops early at RECEIPT_MAX_PAGE_BYTES; nextCursor then continues after its last job."
        ),
        tag="jobs",
        query=schemas.LIST_JOBS_QUERY,
        responses={200: schemas.JOB_PAGE},
        errors=(403,),
    )
)
def list_jobs(query: dict[str, Any]) -> ResponseReturnValue:
    scope = auth.listing_scope(query.get("organizationId"))
    where = search.parse_filter({k: v for k, v in query.items() if k in search.FILTER_FIELDS})
    cursor = inputs.checked_cursor(query.get("cursor"))
    page = state().queue.list_jobs(**scope, where=where, limit=query["limit"], cursor=cursor)
    items = with_waiting([job_json(j) for j in page.jobs], page.jobs)
    fits = limits.fit(items, state().settings.max_page_bytes)
    next_cursor = page.next_cursor
    if fits < len(items):
        # Cut short by RECEIPT_MAX_PAGE_BYTES: the next page starts after the last job sent.
        last = page.jobs[fits - 1]
        next_cursor = encode_cursor(parse_iso(last.created_at) or datetime.min, last.id)
        items = items[:fits]
    return {"jobs": items, "nextCursor": next_cursor}


@blueprint.post("/jobs/<jobId>/commands")
@operation(
    Operation(
        summary="Send a queue command (steer, follow_up or abort) to a job.",
        description="A steer or follow_up is sent on a queue-command lane (`lane`: steer or "
        "follow_up, by default the one its type names); an abort takes no lane.",
        tag="jobs",
        path=_JOB_PATH,
        scoped=True,
        body=schemas.COMMAND_REQUEST,
        responses={202: schemas.JOB_RESPONSE},
        errors=(409, 410, 429),
    )
)
def send_command(jobId: str, body: dict[str, Any]) -> ResponseReturnValue:
    # The whole body is checked before the job is looked up: bad input is a 400 wherever it points.
    lane = command_lane(body["type"], body.get("lane"))
    job = visible_job(jobId)
    outcome = state().queue.command(job.id, body["type"], body.get("payload"), body.get("reason"), lane=lane)
    return {"job": job_json(outcome.job)}, 202


@blueprint.post("/jobs/<jobId>/cancel")
@operation(
    Operation(
        summary="Cancel a job.",
        description="A queued job is canceled outright; a leased or running one gets an abort command "
        "(only its worker can stop work in flight). A terminal job answers 409.",
        tag="jobs",
        path=_JOB_PATH,
        scoped=True,
        body=schemas.CANCEL_REQUEST,
        body_required=False,
        responses={202: schemas.JOB_RESPONSE},
        errors=(409, 410, 429),
    )
)
def cancel(jobId: str, body: dict[str, Any]) -> ResponseReturnValue:
    job = visible_job(jobId)
    outcome = state().queue.cancel(job.id, body.get("reason"))
    return {"job": job_json(outcome.job)}, 202


@blueprint.post("/jobs/<jobId>/replay")
@operation(
    Operation(
        summary="Replay a terminal job: a new job with the same or an edited payload.",
        description="The new job's job.enqueued carries replayOf (the replayed job's id) and the replayed "
        "job's stream gets job.replayed (replayedAs), in one transaction. It stays in the job's "
        "organisation, on its agent, lane, session key and maxAttempts, with its tags and flow fields "
        "(priority, concurrencyKey, concurrencyLimit, debounce) unless the body gives others (null "
        "clears one; a new concurrencyKey does not keep the old key's limit). Its id is the body's "
        "jobId, or derived from the job's id and replayKey (default '1'): a retried request answers "
        "the same replay (created false) and writes nothing. "
        "A job that has not ended, or one of an objective (payload.objectiveId: replan the objective "
        "instead), answers 409; an edited payload is checked and authorised as an enqueue.",
        tag="jobs",
        path=_JOB_PATH,
        scoped=True,
        body=schemas.REPLAY_REQUEST,
        body_required=False,
        responses={202: schemas.REPLAY_RESPONSE},
        errors=(403, 409, 410, 429),
        links=_FOLLOW_THE_JOB,
    )
)
def replay(jobId: str, body: dict[str, Any]) -> ResponseReturnValue:
    source = visible_job(jobId)
    replays.refuse_unless_replayable(source)
    edited = body.get("payload")
    if isinstance(edited, dict):
        # What the caller may not post: another organisation's job, or a job of an objective.
        ctx = edited.get("authContext")
        org = ctx.get("organizationId") if isinstance(ctx, dict) else None
        if org != source.organization_id:
            raise forbidden("payload.authContext.organizationId must stay the replayed job's organisation")
        if "objectiveId" in edited:
            raise forbidden(
                "payload.objectiveId: a replay never joins an objective (its control runs its jobs)"
            )
    req = replays.replay_request(
        source,
        job_id=body.get("jobId"),
        replay_key=body.get("replayKey"),
        payload=body.get("payload"),
        tags=body.get("tags"),
        flow={name: body[name] for name in FLOW_FIELDS if name in body},
    )
    identity = auth.current()
    auth.require_enqueue_allowed(identity, req.agent_id, req)
    result = state().queue.replay(source.id, req, enqueued_by=identity.enqueuer())
    out = {"job": job_json(result.job), "created": result.created, "replayOf": source.client_id}
    return out, 202, {"Location": job_path(result.job)}


@blueprint.post("/jobs:bulk")
@operation(
    Operation(
        summary="Cancel, replay or archive every job a filter selects: a dry run, then pages of 1000.",
        description="Acts in one organisation (a system token must name it with organizationId). dryRun "
        "answers the count and a sample and writes nothing. A run takes an idempotencyKey, acts on at "
        "most limit jobs newest first, each through the single-job path (its own receipt: a cancel; a "
        "replay's job.enqueued and job.replayed, the replay's id derived from the key; an archive's "
        "job.archived, after which the job's stream moves to the archive as the archiving pass moves it, "
        "its tombstone answering 410), and answers the operation's progress with nextCursor to resume "
        "(null: done). A job the action does not apply to (a cancel of an ended job, a replay of an "
        "objective's job, an archive of a job that has not ended or that a live objective owns) is "
        "skipped and counted. The operation is audited on the stream "
        "operations/<organizationId>/<idempotencyKey>: operation.started (who, the filter, the count) "
        "and one operation.page per page; GET /operations/{operationId} reads its progress. The same "
        "key and cursor again answers that page without writing; the same key with another action or "
        "filter is 409.",
        tag="jobs",
        body=schemas.BULK_REQUEST,
        responses={200: schemas.BULK_RESPONSE},
        errors=(403, 409, 429),
        scoped=True,
        named=True,
    )
)
def bulk(body: dict[str, Any]) -> ResponseReturnValue:
    org = auth.scoped_organization()
    where = search.parse_filter(body["filter"], prefix="filter.")
    cursor = inputs.checked_cursor(body.get("cursor"))
    if body.get("dryRun", False):
        found = bulk_actions.dry_run(state().engine, search.Scope(org), where)
        return {"dryRun": True, "count": found.count, "sample": [job_json(j) for j in found.sample]}, 200
    identity = auth.current()
    progress = bulk_actions.run_page(
        state().queue,
        organization_id=org,
        key=body["idempotencyKey"],
        action=body["action"],
        f=where,
        by=identity.enqueuer().to_json(),
        cursor=cursor,
        # JSON Schema counts 538.0 as an integer: the page size is the whole number it names.
        limit=int(body.get("limit", bulk_actions.BULK_PAGE_MAX)),
        reason=body.get("reason"),
        authorize=bulk_authorizer(identity),
        sink=DirectorySink(state().settings.archive_path),
    )
    return {"dryRun": False, **progress.to_json()}, 200


def bulk_authorizer(identity: auth.Identity) -> bulk_actions.Authorize:
    """What a bulk replay checks for each new job: that ``identity`` may post it, as an enqueue
    (a replayed codex job runs a command: the caller must hold that right). A refusal skips that job."""

    def authorize(req: EnqueueRequest) -> None:
        try:
            auth.require_enqueue_allowed(identity, req.agent_id, req)
        except ApiError as exc:
            raise PermissionError(exc.message) from None

    return authorize


@blueprint.get("/operations/<operationId>")
@operation(
    Operation(
        summary="Read a bulk operation's progress, from its audit stream.",
        description="What POST /jobs:bulk recorded under this idempotencyKey in the organisation the "
        "request acts in (a system token must name it): the action, the filter, who started it, the "
        "count it matched, and its totals over the pages done so far; nextCursor is where the next "
        "page starts (null: done). Another organisation's operation of the same key is the unknown "
        "key's 404.",
        tag="jobs",
        path={"operationId": schemas.OPERATION_ID_PARAM},
        responses={200: schemas.OPERATION_RESPONSE},
        scoped=True,
        named=True,
    )
)
def get_operation(operationId: str) -> ResponseReturnValue:
    org = auth.scoped_organization()
    found = bulk_actions.status(state().engine, org, operationId)
    if found is None:
        raise ApiError(404, NOT_FOUND, "no bulk operation of this organisation has this id")
    return {"operation": operation_json(org, found)}


def operation_json(organization_id: str, progress: bulk_actions.Progress) -> dict[str, Any]:
    """An operation as ``GET /operations/{operationId}`` shows it (the dashboard shows the same)."""
    return {
        **progress.to_json(),
        "organizationId": organization_id,
        "filter": dict(progress.filter),
        "by": dict(progress.by),
        "pages": progress.pages,
        "startedAt": iso(progress.started_at),
        "updatedAt": iso(progress.updated_at),
        "stream": bulk_actions.operation_stream(organization_id, progress.operation_id),
    }


@blueprint.get("/dead-letters")
@operation(
    Operation(
        summary="Dead letters: jobs that failed for good, per agent and kind, with counts by error.",
        description="A job is a dead letter when it is failed: its failure was not retryable, or its "
        "attempts were spent. A system token must name the organisation. Filters as GET /jobs (agentId, "
        "kind, lane, tag, errorPrefix, time range); "
        "the jobs themselves are GET /jobs?status=failed with the same filters, and they are replayed "
        "one by one (POST /jobs/{jobId}/replay) or by filter (POST /jobs:bulk, action replay).",
        tag="jobs",
        query=schemas.DEAD_LETTERS_QUERY,
        responses={200: schemas.DEAD_LETTERS},
        scoped=True,
        named=True,
    )
)
def dead_letters(query: dict[str, Any]) -> ResponseReturnValue:
    where = search.parse_filter({k: v for k, v in query.items() if k in search.FILTER_FIELDS})
    with read_connection(state().engine) as conn:
        groups = search.dead_letters(conn, search.Scope(auth.scoped_organization()), where)
    return {"groups": [g.to_json() for g in groups], "total": sum(g.count for g in groups)}
