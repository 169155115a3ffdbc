"""Acting on everything a filter matches, and the dead letters: the dashboard's side of
``POST /jobs:bulk``, ``GET /operations/{operationId}`` and ``GET /dead-letters``.

The flow: the jobs page selects every job its filter matches and picks an action; the confirm page
shows the dry run (the count and a sample); confirming runs the first page and opens the
operation's page, which runs the next pages one request at a time (its script, or a Continue
button without one) and shows the progress live from the operation's audit stream (SSE, as a job's
page follows a job). Every write goes through ``app.ops.bulk_actions`` with the API's checks (its
filter fields, the right to post each replay, the organisation), so the dashboard can do nothing
the caller's token could not do over HTTP. A system session acts in the organisation its filter
names, and must name one.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import replace
from typing import Any, Final

from flask import Response, jsonify, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue

from api import auth, inputs, jsonbody, schemas, sse
from api.context import read_connection, state
from api.errors import FORBIDDEN, ApiError
from api.following import sse_timing
from api.jobs import bulk_authorizer, operation_json
from api.ui import BLUEPRINT, UiError, blueprint, current_session
from api.ui.jobs_views import filter_args, read_filters, row_view
from app.jobs.errors import ValidationError
from app.jobs.kinds import PAYLOAD_KINDS
from app.jobs.vocab import BULK_ACTIONS, LANES
from app.ops import bulk_actions
from app.retention.sink import DirectorySink
from app.storage import search
from app.storage.db import ERROR_TEXT_LENGTH

# Jobs one request of the dashboard acts on: small enough that each page returns within about a
# second, so the progress moves while the operation runs (the API's cap is BULK_PAGE_MAX).
UI_PAGE: Final = 200
SAMPLE: Final = 10
KEY_FIELD: Final = "key"
# What each action does to a job the filter selects, and what it skips (fixed texts).
ACTION_NOTES: Final[Mapping[str, str]] = {
    "cancel": "Each job gets its own cancel: a queued job is canceled at once, a running one is sent an "
    "abort. A job that has already ended is skipped and counted.",
    "replay": "Each ended job is re-run as a new job with the same payload, linked both ways "
    "(replayOf, replayedAs); running the operation again replays nothing twice. A job that has not "
    "ended, or one of an objective (replan the objective instead), is skipped and counted.",
    "archive": "Each ended job gets a job.archived receipt, then its stream moves to the archive as "
    "the retention pass moves it: a tombstone stays, and reading the job answers 410. A job that has "
    "not ended, or one a live objective owns, is skipped and counted.",
}
ACTION_TITLES: Final[Mapping[str, str]] = {"cancel": "Cancel", "replay": "Replay", "archive": "Archive"}
DONE_VERBS: Final[Mapping[str, str]] = {"cancel": "canceled", "replay": "replayed", "archive": "archived"}


def _acting(f: search.JobFilter) -> tuple[str, search.JobFilter]:
    """The organisation a bulk action on ``f`` acts in -- the session's own, or the one a system
    session's filter names (it must) -- and the filter as the API takes it (the organisation is the
    scope, not a filter field); a filter the API could not express is refused."""
    if f.worker_group is not None:
        raise ValidationError("group", "is not a filter a bulk action takes (POST /jobs:bulk)")
    if f.text:
        raise ValidationError("q", "is not a filter a bulk action takes (POST /jobs:bulk)")
    identity = current_session().identity
    org = f.organization_id if identity.all_organizations else identity.organization_id
    if org is None:
        # The API's rule (a 403 naming the field), for the dashboard's name of it: the filter ``org``.
        raise ApiError(403, FORBIDDEN, f"org {auth.SYSTEM_MUST_NAME}", {"field": "org"})
    return org, replace(f, organization_id=None)


def _action(source: Mapping[str, str]) -> str:
    value = source.get("action", "")
    if value not in BULK_ACTIONS:
        raise ValidationError("action", "is not one of the allowed values", allowed=BULK_ACTIONS)
    return value


@blueprint.get("/jobs/bulk")
def bulk_confirm() -> ResponseReturnValue:
    """The dry run of an action on everything the filter matches, and the form that confirms it."""
    action = _action(request.args)
    org, f = _acting(read_filters())
    found = bulk_actions.dry_run(state().engine, search.Scope(org), f, sample=SAMPLE)
    args = filter_args(replace(f, organization_id=org if current_session().identity.system else None))
    return render_template(
        "bulk.html",
        action=action,
        title=ACTION_TITLES[action],
        note=ACTION_NOTES[action],
        count=found.count,
        rows=[row_view(j) for j in found.sample],
        filters=args,
        described=f.to_json(),
        organization=org,
        # New for each confirm page: a double submit of this form is one operation, not two.
        key="ui-" + secrets.token_hex(8),
        key_field=KEY_FIELD,
        back_url=url_for(f"{BLUEPRINT}.jobs", **args),
    )


@blueprint.post("/jobs/bulk")
def bulk_run() -> ResponseReturnValue:
    """Start the operation: its first page, then its page (which runs the rest)."""
    action = _action(request.form)
    org, f = _acting(read_filters(request.form))
    key = request.form.get(KEY_FIELD, "")
    inputs.check(key, schemas.OPERATION_ID_PARAM, root="key")
    reason = request.form.get("reason", "").strip() or None
    if reason is not None:
        jsonbody.check_storable({"reason": reason})
        inputs.check({"reason": reason}, schemas.CANCEL_REQUEST)
    _run_page(org, key, action, f, cursor=None, reason=reason)
    return redirect(_operation_url(org, key, drive=True), code=303)


def _run_page(
    org: str, key: str, action: str, f: search.JobFilter, *, cursor: str | None, reason: str | None
) -> bulk_actions.Progress:
    identity = current_session().identity
    return bulk_actions.run_page(
        state().queue,
        organization_id=org,
        key=key,
        action=action,
        f=f,
        by=identity.enqueuer().to_json(),
        cursor=cursor,
        limit=UI_PAGE,
        reason=reason,
        authorize=bulk_authorizer(identity),
        sink=DirectorySink(state().settings.archive_path),
    )


def _operation_url(org: str, key: str, *, drive: bool = False) -> str:
    """The operation's page; ``drive``: its script runs the pages still to do."""
    if drive:
        return url_for(f"{BLUEPRINT}.operation", operationId=key, organizationId=org, drive="1")
    return url_for(f"{BLUEPRINT}.operation", operationId=key, organizationId=org)


def _found(key: str) -> tuple[str, bulk_actions.Progress]:
    """The operation ``key`` of the organisation this page acts in (a system session names it);
    another organisation's is the same 404 as a key no one used."""
    jsonbody.check_param(key, "operationId")
    inputs.check(key, schemas.OPERATION_ID_PARAM, root="operationId")
    org = auth.named_organization()
    progress = bulk_actions.status(state().engine, org, key)
    if progress is None:
        raise UiError(404, "Not found", "No bulk operation of this organisation has this id.")
    return org, progress


def _operation_context(org: str, progress: bulk_actions.Progress) -> dict[str, Any]:
    shown = operation_json(org, progress)
    matched = max(progress.matched, progress.processed, 1)
    return {
        "op": shown,
        "title": ACTION_TITLES.get(progress.action, progress.action),
        "done_verb": DONE_VERBS.get(progress.action, progress.action),
        "percent": 100 if progress.done else min(99, progress.processed * 100 // matched),
        "jobs_url": _jobs_url_of(org, progress.filter),
    }


def _jobs_url_of(org: str, recorded: Mapping[str, Any]) -> str:
    """The jobs page showing an operation's filter (as the API spells it) in its organisation."""
    names = {
        "status": "status",
        "agentId": "agent",
        "lane": "lane",
        "sessionKey": "session",
        "kind": "kind",
        "tag": "tag",
        "errorPrefix": "error",
        "createdAfter": "from",
        "createdBefore": "to",
    }
    args = {names[k]: v for k, v in recorded.items() if k in names}
    if current_session().identity.system:
        args["org"] = org
    return url_for(f"{BLUEPRINT}.jobs", **args)


@blueprint.get("/operations/<operationId>")
def operation(operationId: str) -> ResponseReturnValue:
    org, progress = _found(operationId)
    drive = request.args.get("drive") == "1" and not progress.done
    return render_template(
        "operation.html",
        organization=org,
        drive=drive,
        fragment_url=url_for(f"{BLUEPRINT}.operation_fragment", operationId=operationId, organizationId=org),
        events_url=url_for(f"{BLUEPRINT}.operation_events", operationId=operationId, organizationId=org),
        next_url=url_for(f"{BLUEPRINT}.operation_next", operationId=operationId, organizationId=org),
        **_operation_context(org, progress),
    )


@blueprint.get("/operations/<operationId>/fragment")
def operation_fragment(operationId: str) -> ResponseReturnValue:
    """The live part of the operation page (its totals), fetched after each page it records."""
    org, progress = _found(operationId)
    return render_template("_operation_body.html", **_operation_context(org, progress))


@blueprint.get("/operations/<operationId>/events")
def operation_events(operationId: str) -> ResponseReturnValue:
    """The operation's audit stream as Server-Sent Events (one ``receipt`` event per page)."""
    org, _progress = _found(operationId)
    st = state()
    timing = sse_timing()
    token_id = current_session().identity.token_id
    stream = bulk_actions.operation_stream(org, operationId)
    return sse.event_stream_response(sse.follow(st.engine, st.poller, stream, 0, "receipt", timing, token_id))


@blueprint.post("/operations/<operationId>/next")
def operation_next(operationId: str) -> ResponseReturnValue:
    """Run the operation's next page (nothing once it is done). The page's script asks for JSON
    (``{done, processed, matched}``); a plain form post returns to the operation's page."""
    org, progress = _found(operationId)
    if not progress.done:
        # The filter and action it started with (its audit records them as the API spells them).
        f = search.parse_filter(progress.filter, prefix="filter.")
        progress = _run_page(org, operationId, progress.action, f, cursor=progress.next_cursor, reason=None)
    if request.accept_mimetypes.best == "application/json":
        response: Response = jsonify(
            {"done": progress.done, "processed": progress.processed, "matched": progress.matched}
        )
        return response
    return redirect(_operation_url(org, operationId, drive=True), code=303)


# -- the dead letters ---------------------------------------------------------------------------------


@blueprint.get("/dead-letters")
def dead_letters() -> ResponseReturnValue:
    """Jobs that failed for good, per agent and kind with counts by error, each with a replay. A
    system session names the organisation (the Organisation filter); until it does, the page asks."""
    identity = current_session().identity
    f = replace(read_filters(), status=None)
    org = f.organization_id if identity.all_organizations else identity.organization_id
    groups: list[search.DeadLetterGroup] = []
    if org is not None:
        with read_connection(state().engine) as conn:
            groups = search.dead_letters(conn, search.Scope(org), replace(f, organization_id=None))
    shown = filter_args(f)

    def replay_url(agent: str, kind: str, error: str | None = None) -> str:
        args: dict[str, Any] = {**shown, "status": "failed", "agent": agent, "kind": kind}
        if error is not None:
            args["error"] = error
        return url_for(f"{BLUEPRINT}.bulk_confirm", action="replay", **args)

    def list_url(agent: str, kind: str) -> str:
        return url_for(f"{BLUEPRINT}.jobs", **{**shown, "status": "failed", "agent": agent, "kind": kind})

    return render_template(
        "dead_letters.html",
        groups=groups,
        total=sum(g.count for g in groups),
        filters=shown,
        kinds=PAYLOAD_KINDS,
        lanes=LANES,
        system=identity.system,
        needs_organization=org is None,
        replay_url=replay_url,
        list_url=list_url,
        error_max=ERROR_TEXT_LENGTH,
    )
