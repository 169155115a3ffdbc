"""Objective pages: the list, and one objective's task graph coloured by status, updating live.

Everything about where objectives come from is behind ``api.ui.objectives.FactoryReader``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from flask import current_app, render_template, request, url_for
from flask.typing import ResponseReturnValue
from sqlalchemy.engine import Engine

from api import inputs, jsonbody, schemas, sse
from api.auth import scoped_organization
from api.context import read_connection, state
from api.following import resume_point, sse_timing
from api.ui import BLUEPRINT, UiError, blueprint, current_session, graph, redact
from api.ui.objectives import FactoryReader, ObjectiveReader
from api.watch import StreamPoller
from app.jobs.errors import ValidationError
from app.storage import heads, store
from app.storage.overview import Scope

PAGE_SIZE = 50
# Tests replace the finder through app.extensions (no module globals).
FINDER_EXTENSION = "receipt.ui.objective_finder"


def _reader() -> ObjectiveReader:
    """The Factory's reader (a test may put its own behind the seam, under ``FINDER_EXTENSION``)."""
    finder: Callable[[Engine], ObjectiveReader] = current_app.extensions.get(FINDER_EXTENSION, FactoryReader)
    return finder(state().engine)


def _scope() -> Scope:
    """What the list shows: every organisation for a system identity, else the caller's own."""
    identity = current_session().identity
    return Scope(identity.organization_id, all_organizations=identity.system)


def _one() -> Scope:
    """Where a page names one objective: the caller's organisation, or the one
    ``?organizationId=`` names (a system identity's right, as in the API)."""
    return Scope(scoped_organization(), all_organizations=False)


def _objective(objective_id: str) -> dict[str, Any]:
    jsonbody.check_param(objective_id, "objectiveId")
    found = _reader().get(_one(), objective_id)
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
    """Change signals for the page, which refetches its graph on each: the objective stream's
    receipts (``receipt``, with their seq) and its queued or running tasks' jobs changing
    (``task``, no id), so a task's job starting recolours the graph without a receipt."""
    objective = _objective(objectiveId)["objective"]  # visibility (the reader scopes) first
    after = resume_point(inputs.read_query(schemas.scoped_query(schemas.EVENTS_QUERY)))
    st = state()
    timing = sse_timing()
    scope, reader = _one(), _reader()
    token_id = current_session().identity.token_id

    def overlaid() -> list[str]:
        found = reader.get(scope, objectiveId) or {}
        return [t["jobStream"] for t in found.get("tasks", ()) if _overlaid(t)]

    jobs = [t["jobStream"] for t in objective.get("tasks", ()) if _overlaid(t)]
    frames = _page_signals(st.engine, st.poller, objective["stream"], after, jobs, overlaid, timing, token_id)
    return sse.event_stream_response(frames)


def _overlaid(task: Mapping[str, Any]) -> bool:
    return bool(task.get("jobStream")) and task.get("status") in ("queued", "running")


def _page_signals(
    engine: Engine,
    poller: StreamPoller,
    stream: str,
    after: int,
    jobs: list[str],
    overlaid: Callable[[], list[str]],
    timing: sse.Timing,
    token_id: str | None,
) -> Iterator[str]:
    pacer = sse.Pacer(timing)
    yield pacer.retry_frame()
    try:
        with read_connection(engine) as conn:
            start = heads.read(conn, jobs, ()).seqs
    except Exception:
        yield sse.STORAGE_UNAVAILABLE
        return
    with sse.subscribed(poller, {stream: after, **{j: start.get(j, 0) for j in jobs}}, token_id) as sub:
        read = True
        while True:
            if (end := sse.ended(sub)) is not None:
                yield end
                return
            advanced = sub.advanced()
            seq = after
            watched: set[str] | None = None
            try:
                batch = []
                if read or stream in advanced:
                    with read_connection(engine) as conn:
                        batch = store.read_stream(conn, stream, after=after, limit=sse.BATCH)
                    # Tasks that became queued now have jobs to watch (and settled ones have not).
                    if batch:
                        watched = set(overlaid())
            except Exception:
                yield sse.STORAGE_UNAVAILABLE
                return
            for receipt in batch:
                seq = receipt.seq
                yield sse.format_event("receipt", seq, {"seq": seq, "type": receipt.type})
            after = seq
            sub.read_up_to(stream, after)
            read = len(batch) == sse.BATCH
            jobs_moved = {s: h for s, h in advanced.items() if s != stream}
            for job, head in jobs_moved.items():
                sub.read_up_to(job, head)
            if jobs_moved:
                yield sse.format_event("task", None, {"jobs": len(jobs_moved)})
            if watched is not None:
                for job in set(jobs) - watched:
                    sub.unwatch(job)
                for job in watched - set(jobs):
                    sub.watch(job, 0)
                jobs = sorted(watched)
            if read:
                continue
            yield from pacer.idle(sub)
            if pacer.expired:
                return
