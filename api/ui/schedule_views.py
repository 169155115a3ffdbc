"""Schedule pages: the list (each schedule's next fire time and last outcome) and one schedule's
recent fires, each with its job's status. Read-only: declaring and changing schedules is the API's
and the CLI's (``receipt schedules``)."""

from __future__ import annotations

from typing import Any

from flask import render_template, request, url_for
from flask.typing import ResponseReturnValue

from api import jsonbody
from api.auth import scoped_organization
from api.context import read_connection, state
from api.schedules import schedule_json
from api.ui import BLUEPRINT, UiError, blueprint, current_session
from app.jobs.errors import ValidationError
from app.schedules import service, storage
from app.schedules.vocab import SCHEDULE_STATUSES

PAGE_SIZE = 50
FIRES_SHOWN = 100
LISTED_STATUSES = tuple(s for s in SCHEDULE_STATUSES if s != "deleted")


@blueprint.get("/schedules")
def schedules() -> ResponseReturnValue:
    status = request.args.get("status", "").strip() or None
    if status is not None and status not in SCHEDULE_STATUSES:
        raise ValidationError("status", "is not one of the allowed values", allowed=SCHEDULE_STATUSES)
    cursor = request.args.get("cursor", "").strip() or None
    if cursor is not None:
        jsonbody.check_param(cursor, "cursor")
    identity = current_session().identity
    with read_connection(state().engine) as conn:
        page = storage.list_page(
            conn,
            organization_id=identity.organization_id,
            all_organizations=identity.system,
            status=status,
            limit=PAGE_SIZE,
            cursor=cursor,
        )
    return render_template(
        "schedules.html",
        rows=[schedule_json(s) for s in page.schedules],
        status=status,
        statuses=LISTED_STATUSES,
        next_url=url_for(f"{BLUEPRINT}.schedules", status=status, cursor=page.next_cursor)
        if page.next_cursor
        else None,
    )


@blueprint.get("/schedules/<scheduleId>")
def schedule(scheduleId: str) -> ResponseReturnValue:
    jsonbody.check_param(scheduleId, "scheduleId")
    found = service.find(state().engine, scoped_organization(), scheduleId)
    if found is None:
        raise UiError(404, "Not found", "no schedule with that id")
    fires: list[dict[str, Any]] = []
    for r in service.fires(state().engine, found.id, before=None, limit=FIRES_SHOWN):
        fires.append(
            {
                "seq": r.seq,
                "type": r.type.removeprefix("schedule."),
                "at": r.at,
                "body": dict(r.body),
                "job": r.job,
            }
        )
    return render_template("schedule.html", schedule=schedule_json(found), fires=fires)
