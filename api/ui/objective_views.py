"""Objective pages: the list, and one objective's task graph coloured by status, updating live.

Everything about where objectives come from is behind ``api.ui.objectives.find_reader``;
without the Factory these pages answer 501 with ``objectives.NOT_AVAILABLE``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import current_app, render_template, request, url_for
from flask.typing import ResponseReturnValue

from api import inputs, jsonbody, schemas, sse
from api.context import state
from api.streams import resume_point
from api.ui import BLUEPRINT, UiError, blueprint, current_session, graph, redact
from api.ui.objectives import ObjectiveReader, Unavailable, find_reader, stream_of
from app.jobs.errors import ValidationError
from app.storage.overview import Scope

PAGE_SIZE = 50
# Tests replace the finder through app.extensions (no module globals).
FINDER_EXTENSION = "receipt.ui.objective_finder"


def _reader() -> ObjectiveReader:
    finder: Callable[..., ObjectiveReader | Unavailable] = current_app.extensions.get(
        FINDER_EXTENSION, find_reader
    )
    found = finder(state().engine)
    if isinstance(found, Unavailable):
        raise UiError(501, "Objectives unavailable", found.reason)
    return found


def _scope() -> Scope:
    identity = current_session().identity
    return Scope(identity.organization_id, all_organizations=identity.system)


def _objective(objective_id: str) -> dict[str, Any]:
    jsonbody.check_param(objective_id, "objectiveId")
    found = _reader().get(_scope(), objective_id)
    if found is None:
        raise UiError(404, "Not found", "no objective with that id")
    objective = dict(found)
    done, total = graph.progress(objective)
    return {
        "objective": objective,
        "layout": graph.layout(objective),
        "counts": graph.status_counts(objective),
        "done": done,
        "total": total,
        "colours": graph.COLOURS,
        "node_w": graph.NODE_W,
        "node_h": graph.NODE_H,
        "terminal": objective.get("status") in ("completed", "failed", "canceled"),
        "pretty": redact.pretty,
        "brief": redact.brief,
    }


@blueprint.get("/objectives")
def objectives() -> ResponseReturnValue:
    status = request.args.get("status", "").strip() or None
    if status is not None and status not in graph.OBJECTIVE_STATUSES:
        raise ValidationError("status", "is not one of the allowed values", allowed=graph.OBJECTIVE_STATUSES)
    cursor = request.args.get("cursor", "").strip() or None
    if cursor is not None:
        jsonbody.check_param(cursor, "cursor")
    page = _reader().list(_scope(), status=status, limit=PAGE_SIZE, cursor=cursor)
    rows = []
    for o in page.objectives:
        done, total = graph.progress(o)
        rows.append({"objective": o, "done": done, "total": total})
    return render_template(
        "objectives.html",
        rows=rows,
        status=status,
        statuses=graph.OBJECTIVE_STATUSES,
        next_url=url_for(f"{BLUEPRINT}.objectives", status=status, cursor=page.next_cursor)
        if page.next_cursor
        else None,
    )


@blueprint.get("/objectives/<objectiveId>")
def objective(objectiveId: str) -> ResponseReturnValue:
    return render_template("objective.html", **_objective(objectiveId))


@blueprint.get("/objectives/<objectiveId>/fragment")
def objective_fragment(objectiveId: str) -> ResponseReturnValue:
    return render_template("_objective_body.html", **_objective(objectiveId))


@blueprint.get("/objectives/<objectiveId>/events")
def objective_events(objectiveId: str) -> ResponseReturnValue:
    """The objective stream's receipts as SSE: the page refetches its graph on each one."""
    _objective(objectiveId)  # visibility (the reader scopes) before anything streams
    after = resume_point(inputs.read_query(schemas.EVENTS_QUERY))
    st = state()
    timing = sse.Timing(
        poll_ms=st.settings.sse_poll_ms,
        max_seconds=st.settings.sse_max_seconds,
        heartbeat_seconds=st.sse_heartbeat_seconds,
    )
    return sse.event_stream_response(sse.follow(st.engine, stream_of(objectiveId), after, "receipt", timing))
