"""Receipt streams over HTTP: raw receipts, and Server-Sent Events for jobs and streams.

Scoping: ``jobs/<jobId>`` streams are readable by the job's organisation (and system
identities); every other stream — ``tokens/...`` holds token hashes — is system-only. A stream
the caller may not read answers 404, like one that does not exist.
"""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response
from flask.typing import ResponseReturnValue

from api import auth, limits, schemas, sse
from api.context import read_connection, state
from api.errors import ApiError, archived, job_not_found, stream_not_found
from api.following import held_stream, resume_point, sse_timing
from api.jobs import visible_job
from api.openapi import Operation, operation
from app.jobs.vocab import is_job_stream, job_id_of
from app.storage import store, tombstones

blueprint = Blueprint("streams", __name__)

_STREAM_PATH = {"stream": schemas.STREAM_PARAM}
_RESUME_HEADERS = {"Last-Event-ID": schemas.LAST_EVENT_ID_HEADER}


def readable_stream(stream: str) -> None:
    """Raise the 404 unless the caller may read ``stream`` and it exists.

    A job's or objective's stream name carries its key (``jobs/<org>/<id>``): the record is read by
    that key and its organisation checked, so another organisation's stream is the same 404.
    """
    if is_job_stream(stream):
        job = state().queue.get(job_id_of(stream))
        if job is None:
            _refuse_if_archived(stream)
        if job is None or not auth.current().may_see(job):
            raise job_not_found()
        return
    from api.objectives import readable_objective_stream

    try:
        if readable_objective_stream(stream):
            return  # an objective's stream is readable by its organisation
    except ApiError:
        _refuse_if_archived(stream)
        raise
    if not auth.current().system:
        raise stream_not_found()
    with read_connection(state().engine) as conn:
        if store.head(conn, stream) is None:
            raise stream_not_found()


def _refuse_if_archived(stream: str) -> None:
    """The 410 of an archived stream its caller may read: its history is in an archive segment.
    For anyone else it stays the 404 of a stream that never was."""
    with read_connection(state().engine) as conn:
        gone = tombstones.find(conn, stream)
    if gone is not None and auth.current().may_act_for(gone.organization_id):
        raise archived(gone.to_json())


def _follow(stream: str, after: int, kind: sse.EventKind) -> Response:
    st = state()
    engine, poller, timing = st.engine, st.poller, sse_timing()
    return held_stream(lambda token_id: sse.follow(engine, poller, stream, after, kind, timing, token_id))


@blueprint.get("/streams/<path:stream>/receipts")
@operation(
    Operation(
        summary="Read a stream's raw receipts in order.",
        description="A page stops early at RECEIPT_MAX_PAGE_BYTES; nextAfter then continues after its last "
        "receipt. An archived job's or objective's stream answers 410 with its summary and the archive "
        "segment holding its receipts (receipt replay --archive reads it).",
        tag="streams",
        path=_STREAM_PATH,
        query=schemas.RECEIPTS_QUERY,
        responses={200: schemas.RECEIPT_PAGE},
        errors=(410,),
    )
)
def receipts(stream: str, query: dict[str, Any]) -> ResponseReturnValue:
    readable_stream(stream)
    limit = query["limit"]
    with read_connection(state().engine) as conn:
        rows = store.read_stream(conn, stream, after=query["after"], limit=limit + 1)
    items = [r.to_json() for r in rows[:limit]]
    fits = limits.fit(items, state().settings.max_page_bytes)
    more = len(rows) > limit or fits < len(items)
    items = items[:fits]
    next_after = items[-1]["seq"] if more and items else None
    return {"stream": stream, "receipts": items, "nextAfter": next_after}


@blueprint.get("/streams/<path:stream>/events")
@operation(
    Operation(
        summary="Follow a stream's receipts as Server-Sent Events (event: receipt, id: seq).",
        tag="streams",
        path=_STREAM_PATH,
        query=schemas.EVENTS_QUERY,
        headers=_RESUME_HEADERS,
        responses={200: schemas.RECEIPT_EVENT},
        errors=(410, 429),
        streams=True,
    )
)
def stream_events(stream: str, query: dict[str, Any]) -> ResponseReturnValue:
    readable_stream(stream)
    after = resume_point(query)
    return _follow(stream, after, "receipt")


@blueprint.get("/jobs/<jobId>/events")
@operation(
    Operation(
        summary="Follow a job as Server-Sent Events: its state after each change (event: job, id: seq).",
        description="Ends after a terminal job's last event. Resume with Last-Event-ID.",
        tag="jobs",
        path={"jobId": schemas.JOB_ID_PARAM},
        query=schemas.EVENTS_QUERY,
        headers=_RESUME_HEADERS,
        responses={200: schemas.JOB_EVENT},
        errors=(410, 429),
        streams=True,
        scoped=True,
    )
)
def job_events(jobId: str, query: dict[str, Any]) -> ResponseReturnValue:
    job = visible_job(jobId)
    after = resume_point(query)
    return _follow(job.stream, after, "job")
