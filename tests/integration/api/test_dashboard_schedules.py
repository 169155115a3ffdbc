"""The dashboard's schedules pages: the list (next fire time, last outcome) and one schedule's ticks,
scoped like the API."""

from __future__ import annotations

import re
from typing import Any

from app.schedules import service
from tests.support.api import ORG_A, Api


def sign_in(api: Api, who: str = "a") -> None:
    response = api.client.post("/ui/signin", data={"token": api.secrets[who]})
    assert response.status_code == 302, response.get_data(as_text=True)


def declare(api: Api, schedule_id: str, **extra: Any) -> None:
    body: dict[str, Any] = {
        "scheduleId": schedule_id,
        "cron": "0 30 2 * * *",
        "timeZone": "Europe/Paris",
        "job": {"agentId": "factory", "payload": {"kind": "factory.run"}},
    }
    body.update(extra)
    response = api.client.post("/schedules", json=body, headers=api.headers())
    assert response.status_code == 201, response.get_data(as_text=True)


def row_of(page: str, schedule_id: str) -> str:
    match = re.search(rf'<tr data-schedule-id="{re.escape(schedule_id)}">(.*?)</tr>', page, re.S)
    assert match, f"no row for {schedule_id}"
    return match.group(1)


def test_the_list_shows_next_fire_times_and_last_outcomes(sqlite_api: Api) -> None:
    api = sqlite_api
    declare(api, "nightly")
    declare(api, "backfilled", cron="0 0 * * *", timeZone="UTC")
    service.backfill(api.queue, f"{ORG_A}/backfilled", "2026-01-01T00:00:00Z", "2026-01-01T00:00:00.5Z")
    declare(api, "held", paused=True)
    sign_in(api)
    page = api.client.get("/ui/schedules").get_data(as_text=True)
    nightly = row_of(page, "nightly")
    assert "0 30 2 * * *" in nightly and "Europe/Paris" in nightly and "none yet" in nightly
    assert re.search(r'data-next-fire><time datetime="\d{4}-\d\d-\d\dT0[01]:30:00', nightly)
    backfilled = row_of(page, "backfilled")
    assert "outcome-fired" in backfilled and "2026-01-01 00:00:00" in backfilled
    held = row_of(page, "held")
    assert "schedule-paused" in held and 'data-next-fire><span class="muted">—' in held
    only_paused = api.client.get("/ui/schedules?status=paused").get_data(as_text=True)
    assert 'data-schedule-id="held"' in only_paused and 'data-schedule-id="nightly"' not in only_paused


def test_one_schedule_shows_its_ticks_with_their_jobs(sqlite_api: Api) -> None:
    api = sqlite_api
    declare(api, "daily", cron="0 0 * * *", timeZone="UTC")
    service.backfill(api.queue, f"{ORG_A}/daily", "2026-01-01T00:00:00Z", "2026-01-02T00:00:00Z")
    sign_in(api)
    page = api.client.get("/ui/schedules/daily").get_data(as_text=True)
    assert page.count('class="tag outcome-fired"') == 2
    assert "daily:20260102T000000Z" in page and 'href="/ui/jobs/daily:20260102T000000Z' in page


def test_another_organisation_sees_neither_the_row_nor_the_page(sqlite_api: Api) -> None:
    api = sqlite_api
    declare(api, "nightly")
    sign_in(api, "b")
    assert 'data-schedule-id="nightly"' not in api.client.get("/ui/schedules").get_data(as_text=True)
    assert api.client.get("/ui/schedules/nightly").status_code == 404
