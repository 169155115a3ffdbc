"""Jobs pages: the filtered list with counts by status, a job's receipt timeline, and its actions.

Reads go through ``app.storage.overview`` (the list) and the queue/store (a job); writes go
through the very queue operations the API uses, after the API's own visibility check
(``api.jobs.visible_job``) and input schemas, so the dashboard can do nothing the caller's
token could not do over HTTP. Another organisation's job is the same 404 as an unknown one.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator, Mapping
from typing import Any

from flask import redirect, render_template, request, stream_with_context, url_for
from flask.typing import ResponseReturnValue

from api import inputs, jsonbody, schemas, sse
from api.context import read_connection, state
from api.errors import FORBIDDEN, ApiError
from api.following import resume_point, sse_timing
from api.jobs import visible_job
from api.present import job_json
from api.ui import BLUEPRINT, blueprint, current_session, redact, session, timeline
from app.config import TRACE_ID_PLACEHOLDER
from app.jobs.delay import RUN_AT_MAX_CHARS, parse_run_at
from app.jobs.errors import ValidationError
from app.jobs.kinds import PAYLOAD_KINDS
from app.jobs.reducer import Job
from app.jobs.routing import route
from app.jobs.tags import parse_tag_filter
from app.jobs.tracecontext import trace_id_of
from app.jobs.validation import AGENT_ID_MAX, SESSION_KEY_MAX
from app.jobs.vocab import COMMAND_LANES, LANES, STATUSES, WORKER_GROUPS, job_stream
from app.storage import overview, store
from app.storage.db import ERROR_TEXT_LENGTH, iso
from app.storage.queue import decode_cursor

PAGE_SIZE = 50
# How often the live list re-checks that its session's token is still live.
SESSION_RECHECK_SECONDS = 10.0
# A timeline longer than this shows its first receipts and says the stream goes on.
TIMELINE_LIMIT = 2_000
_TEXT_MAX = 256
_CURSOR_MAX = 1024  # the API's own limit for a cursor

# After an action, the job page says what happened (fixed texts: nothing from the request).
NOTICES = {
    "cancel": "Cancel sent: a queued job is canceled; a running one gets an abort command.",
    "steer": "Steer command sent.",
    "follow_up": "Follow-up command sent.",
}


def _text_arg(name: str, limit: int = _TEXT_MAX, source: Mapping[str, str] | None = None) -> str | None:
    value = (request.args if source is None else source).get(name, "").strip()
    if not value:
        return None
    jsonbody.check_param(value, name)
    if len(value) > limit:
        raise ValidationError(name, f"is longer than {limit} characters")
    return value


def _choice_arg(name: str, allowed: tuple[str, ...], source: Mapping[str, str] | None = None) -> str | None:
    value = (request.args if source is None else source).get(name, "").strip()
    if not value:
        return None
    if value not in allowed:
        raise ValidationError(name, "is not one of the allowed values", allowed=allowed)
    return value


def read_filters(source: Mapping[str, str] | None = None) -> overview.JobFilter:
    """The list filters from the query string (or ``source``, a form); a bad value is a 400 naming
    it and what it allows."""
    org = _text_arg("org", source=source)
    identity = current_session().identity
    if org is not None and not identity.may_act_for(org):
        # The API's rule and message for GET /jobs?organizationId= (a 403, not a silent widening).
        raise ApiError(403, FORBIDDEN, "org is not the organisation of this token")
    if not identity.system:
        org = None  # the scope already is this organisation
    tag = _text_arg("tag", source=source)
    created_from = _text_arg("from", RUN_AT_MAX_CHARS, source)
    created_to = _text_arg("to", RUN_AT_MAX_CHARS, source)
    return overview.JobFilter(
        status=_choice_arg("status", STATUSES, source),
        agent_id=_text_arg("agent", AGENT_ID_MAX, source),
        lane=_choice_arg("lane", LANES, source),
        worker_group=_choice_arg("group", WORKER_GROUPS, source),
        text=_text_arg("q", source=source),
        organization_id=org,
        session_key=_text_arg("session", SESSION_KEY_MAX, source),
        kind=_choice_arg("kind", PAYLOAD_KINDS, source),
        tag=parse_tag_filter(tag) if tag is not None else None,
        error_prefix=_text_arg("error", ERROR_TEXT_LENGTH, source),
        created_after=parse_run_at(created_from, "from") if created_from is not None else None,
        created_before=parse_run_at(created_to, "to") if created_to is not None else None,
    )


def _cursor_arg() -> str | None:
    cursor = _text_arg("cursor", _CURSOR_MAX)
    if cursor is not None:
        decode_cursor(cursor)  # a cursor this server did not issue is a 400 naming "cursor"
    return cursor


def _scope() -> overview.Scope:
    identity = current_session().identity
    return overview.Scope(identity.organization_id, all_organizations=identity.system)


def filter_args(f: overview.JobFilter) -> dict[str, Any]:
    """The query string of the jobs page that shows ``f`` (unset filters left out)."""
    values = {
        "status": f.status,
        "agent": f.agent_id,
        "lane": f.lane,
        "group": f.worker_group,
        "q": f.text,
        "org": f.organization_id,
        "session": f.session_key,
        "kind": f.kind,
        "tag": f"{f.tag[0]}:{f.tag[1]}" if f.tag else None,
        "error": f.error_prefix,
        "from": iso(f.created_after) if f.created_after else None,
        "to": iso(f.created_before) if f.created_before else None,
    }
    return {k: v for k, v in values.items() if v}


def bulk_refusal(f: overview.JobFilter) -> str | None:
    """Why the jobs page offers no bulk action on ``f`` (None: it does; ``api.ui.bulk_views``)."""
    if f.worker_group is not None or f.text:
        return "Bulk actions take the API's filters: clear Worker group and Job id contains first."
    if current_session().identity.system and f.organization_id is None:
        return "Name an organisation (the Organisation filter) to act on its jobs."
    return None


def row_view(job: Job) -> dict[str, Any]:
    """What one list row shows (redacted: the list never shows payload secrets)."""
    return {
        "id": job.client_id,
        "agent": job.agent_id,
        "kind": job.kind,
        "lane": job.lane,
        "group": route(job.agent_id, job.kind).worker_group,
        "status": job.status,
        "attempt": job.attempt,
        "maxAttempts": job.max_attempts,
        "org": job.organization_id,
        "createdAt": job.created_at,
        "updatedAt": job.updated_at,
        "summary": _waiting(job)
        or redact.brief(job.error if job.status == "failed" else job.result or job.progress),
    }


def _waiting(job: Job) -> str:
    """A queued job that may not be delivered yet says until when (a delayed job, a retry's backoff)."""
    if job.status != "queued" or not job.available_at:
        return ""
    what = "waits" if job.attempt == 0 else "retry"
    return f"{what} until {job.available_at[:10]} {job.available_at[11:19]} UTC"


def _page(f: overview.JobFilter, cursor: str | None) -> tuple[overview.JobPage, dict[str, int]]:
    with read_connection(state().engine) as conn:
        page = overview.list_jobs(conn, _scope(), f, limit=PAGE_SIZE, cursor=cursor)
        counts = overview.status_counts(conn, _scope(), f)
    return page, counts


@blueprint.get("/jobs")
def jobs() -> ResponseReturnValue:
    f = read_filters()
    cursor = _cursor_arg()
    page, counts = _page(f, cursor)
    args = filter_args(f)
    return render_template(
        "jobs.html",
        rows=[row_view(j) for j in page.jobs],
        counts=counts,
        # Everything the filter matches (the counts are per status under the other filters).
        matching=counts.get(f.status, 0) if f.status else sum(counts.values()),
        bulk_note=bulk_refusal(f),
        filters=args,
        statuses=STATUSES,
        lanes=LANES,
        kinds=PAYLOAD_KINDS,
        groups=WORKER_GROUPS,
        next_url=url_for(f"{BLUEPRINT}.jobs", cursor=page.next_cursor, **args) if page.next_cursor else None,
        first_url=url_for(f"{BLUEPRINT}.jobs", **args) if cursor else None,
        # Only the first page follows live: a later page would shift under the reader.
        live_url=None if cursor else url_for(f"{BLUEPRINT}.jobs_live", **args),
        system=current_session().identity.system,
    )


@blueprint.get("/live/jobs")
def jobs_live() -> ResponseReturnValue:
    """SSE: the first page's rows and the counts, sent again whenever they change."""
    f = read_filters()
    st = state()
    timing = sse.Timing(
        poll_ms=max(st.settings.sse_poll_ms, 500),
        max_seconds=st.settings.sse_max_seconds,
        heartbeat_seconds=st.sse_heartbeat_seconds,
    )
    return sse.event_stream_response(stream_with_context(_list_frames(f, timing)))


def _list_frames(f: overview.JobFilter, timing: sse.Timing) -> Iterator[str]:
    yield f"retry: {max(timing.poll_ms, 1000)}\n\n"
    last_digest = None
    start = timing.clock()
    next_heartbeat = start + timing.heartbeat_seconds
    next_session_check = start + SESSION_RECHECK_SECONDS
    seq = 0
    while True:
        if state().poller.draining:
            yield sse.DRAINING  # the web process is restarting: the browser reconnects to the next
            return
        try:
            page, counts = _page(f, None)
        except Exception:
            yield ": storage unavailable, reconnect\n\n"
            return
        rows = [row_view(j) for j in page.jobs]
        digest = hashlib.sha256(json.dumps([rows, counts], default=str).encode()).hexdigest()
        if digest != last_digest:
            last_digest = digest
            seq += 1
            html = render_template("_job_rows.html", rows=rows)
            yield sse.format_event("jobs", seq, {"html": html, "counts": counts})
        now = timing.clock()
        if now - start >= timing.max_seconds:
            return
        if now >= next_session_check:
            # A revoked token stops this stream within the recheck interval; the browser's
            # reconnect then gets the 401 and the page says live updates stopped.
            if session.current(state().engine) is None:
                yield ": signed out\n\n"
                return
            next_session_check = now + SESSION_RECHECK_SECONDS
        if now >= next_heartbeat:
            yield ": heartbeat\n\n"
            next_heartbeat = now + timing.heartbeat_seconds
        time.sleep(timing.poll_ms / 1000)  # looked up at call time: gevent patches it


def _job_context(job_id: str) -> dict[str, Any]:
    jsonbody.check_param(job_id, "jobId")
    job = visible_job(job_id)
    with read_connection(state().engine) as conn:
        stored = store.read_stream(conn, job_stream(job.id), limit=TIMELINE_LIMIT + 1)
    entries, folded = timeline.build(r.to_receipt() for r in stored[:TIMELINE_LIMIT])
    shown = folded if folded is not None and len(stored) <= TIMELINE_LIMIT else job
    data = job_json(shown)
    template = state().settings.trace_url_template
    trace_id = trace_id_of(job.trace_context)
    return {
        "job": data,
        "trace_url": template.replace(TRACE_ID_PLACEHOLDER, trace_id) if template and trace_id else None,
        "trace_id": trace_id,
        "route": data["route"],
        "entries": entries,
        "truncated": len(stored) > TIMELINE_LIMIT,
        "terminal": shown.terminal,
        "pretty": redact.pretty,
        "brief": redact.brief,
        "command_types": COMMAND_LANES,
        "seq": shown.seq,
    }


@blueprint.get("/jobs/<jobId>")
def job(jobId: str) -> ResponseReturnValue:
    context = _job_context(jobId)
    notice = NOTICES.get(request.args.get("done", ""))
    return render_template("job.html", notice=notice, **context)


@blueprint.get("/jobs/<jobId>/fragment")
def job_fragment(jobId: str) -> ResponseReturnValue:
    """The live part of the job page (status, details, timeline), fetched after each event."""
    return render_template("_job_body.html", **_job_context(jobId))


@blueprint.get("/jobs/<jobId>/events")
def job_events(jobId: str) -> ResponseReturnValue:
    """The API's job event stream, authenticated by the dashboard cookie instead of a Bearer token."""
    jsonbody.check_param(jobId, "jobId")
    job = visible_job(jobId)
    query = inputs.read_query(schemas.scoped_query(schemas.EVENTS_QUERY))
    after = resume_point(query)
    st = state()
    timing = sse_timing()
    token_id = current_session().identity.token_id
    frames = sse.follow(st.engine, st.poller, job_stream(job.id), after, "job", timing, token_id)
    return sse.event_stream_response(frames)


def _reason() -> str | None:
    reason = request.form.get("reason", "").strip() or None
    return reason


@blueprint.post("/jobs/<jobId>/cancel")
def cancel(jobId: str) -> ResponseReturnValue:
    jsonbody.check_param(jobId, "jobId")
    job = visible_job(jobId)
    body: dict[str, Any] = {"reason": _reason()}
    jsonbody.check_storable(body)
    inputs.check(body, schemas.CANCEL_REQUEST)
    state().queue.cancel(job.id, body["reason"])
    return redirect(_job_url(job, done="cancel"), code=303)


def _job_url(job: Job, **args: Any) -> str:
    return url_for(f"{BLUEPRINT}.job", jobId=job.client_id, organizationId=job.organization_id, **args)


@blueprint.post("/jobs/<jobId>/commands")
def command(jobId: str) -> ResponseReturnValue:
    """Send steer or follow_up (abort is the cancel button) through the API's command schema."""
    jsonbody.check_param(jobId, "jobId")
    job = visible_job(jobId)
    type_ = request.form.get("type", "")
    if type_ not in COMMAND_LANES:
        raise ValidationError("type", "is not a command this page sends", allowed=COMMAND_LANES)
    raw = request.form.get("payload", "").strip()
    body: dict[str, Any] = {"type": type_, "reason": _reason()}
    if raw:
        try:
            body["payload"] = jsonbody.parse(raw.encode())
        except ApiError as exc:
            raise ValidationError("payload", "is not valid JSON") from exc
    jsonbody.check_storable(body)
    inputs.check(body, schemas.COMMAND_REQUEST)
    state().queue.command(job.id, type_, body.get("payload"), body["reason"])
    return redirect(_job_url(job, done=type_), code=303)
