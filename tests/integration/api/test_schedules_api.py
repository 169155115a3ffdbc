"""The schedule endpoints: shapes, idempotency, validation naming the field, tenancy, and each
operation's effect (the pass itself is ``tests/integration/test_schedules.py``)."""

from __future__ import annotations

from typing import Any

import pytest

from app.schedules import service
from tests.support.api import ORG_A, ORG_B, Api, json_of

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone


def body(schedule_id: str = "nightly", **extra: Any) -> dict[str, Any]:
    out: dict[str, Any] = {
        "scheduleId": schedule_id,
        "cron": "0 30 2 * * *",
        "timeZone": "Europe/Paris",
        "job": {"agentId": "factory", "payload": {"kind": "factory.run", "goal": "report"}},
    }
    out.update(extra)
    return out


def create(api: Api, who: str = "a", **extra: Any) -> Any:
    return api.client.post("/schedules", json=body(**extra), headers=api.headers(who))


def test_declare_returns_201_with_the_schedule_and_again_200_unchanged(api: Api) -> None:
    response = create(api, overlap="bufferOne", jitterMs=5000, description="the 02:30 report")
    assert response.status_code == 201, response.json
    s = json_of(response)["schedule"]
    assert (s["id"], s["organizationId"], s["stream"]) == ("nightly", ORG_A, f"schedules/{ORG_A}/nightly")
    assert (s["cron"], s["intervalMs"], s["timeZone"], s["overlap"]) == (
        "0 30 2 * * *",
        None,
        "Europe/Paris",
        "bufferOne",
    )
    assert (s["status"], s["catchupWindowMs"], s["jitterMs"], s["source"]) == ("active", 60000, 5000, "api")
    assert s["nextFireAt"].endswith(("00:30:00.000000Z", "01:30:00.000000Z"))  # 02:30 Paris, in UTC
    assert s["lastOutcome"] is None and s["counts"] == {"fired": 0, "missed": 0, "skipped": 0, "buffered": 0}
    # The template got the token's organisation.
    assert s["job"]["payload"]["authContext"]["organizationId"] == ORG_A
    assert response.headers["Location"] == "/schedules/nightly"
    again = create(api, cron="* * * * *")
    assert again.status_code == 200 and json_of(again)["schedule"]["cron"] == "0 30 2 * * *"


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"cron": "0 99 * * *"}, "cron"),
        ({"cron": None}, "cron"),  # neither cron nor interval
        ({"intervalMs": 60000}, "body"),  # both: the schema's oneOf
        ({"cron": None, "intervalMs": 1500}, "intervalMs"),
        ({"timeZone": "Mars/Olympus"}, "timeZone"),
        ({"overlap": "queue"}, "overlap"),
        ({"catchupWindowMs": 5}, "catchupWindowMs"),
        ({"scheduleId": "has:colon"}, "scheduleId"),
        ({"job": {"agentId": "factory", "payload": {"kind": "nope"}}}, "job.payload.kind"),
        ({"job": {"agentId": "factory", "payload": {"kind": "factory.run"}, "jobId": "x"}}, "job.jobId"),
        ({"startAt": "2026-05-01T00:00:00Z", "endAt": "2026-04-01T00:00:00Z"}, "endAt"),
    ],
)
def test_bad_declarations_are_400_naming_the_field(api: Api, extra: dict[str, Any], field: str) -> None:
    before = api.receipt_count()
    response = create(api, **extra)
    assert response.status_code == 400, response.json
    assert json_of(response)["error"]["details"]["field"] == field
    assert api.receipt_count() == before


def test_another_organisation_can_neither_see_change_nor_trigger_it(api: Api) -> None:
    assert create(api).status_code == 201
    for method, path, payload in (
        ("GET", "/schedules/nightly", None),
        ("PATCH", "/schedules/nightly", {"overlap": "allow"}),
        ("POST", "/schedules/nightly/pause", {}),
        ("POST", "/schedules/nightly/trigger", {}),
        (
            "POST",
            "/schedules/nightly/backfill",
            {"startAt": "2026-01-01T00:00:00Z", "endAt": "2026-01-02T00:00:00Z"},
        ),
        ("GET", "/schedules/nightly/fires", None),
        ("DELETE", "/schedules/nightly", None),
    ):
        response = api.client.open(path, method=method, json=payload, headers=api.headers("b"))
        assert response.status_code == 404, (method, path)
        assert json_of(response)["error"]["message"] == "no schedule with that id"
    assert json_of(api.client.get("/schedules", headers=api.headers("b")))["schedules"] == []
    # B declaring the same id declares B's own.
    mine = create(api, "b", job={"agentId": "factory", "payload": {"kind": "factory.run"}})
    assert mine.status_code == 201 and json_of(mine)["schedule"]["organizationId"] == ORG_B
    # A's schedule is as it was, and a system token reaches it by naming the organisation.
    a = json_of(api.client.get("/schedules/nightly", headers=api.headers("a")))["schedule"]
    assert (a["status"], a["overlap"], a["seq"]) == ("active", "skip", 1)
    sys = api.client.get(
        "/schedules/nightly", query_string={"organizationId": ORG_A}, headers=api.headers("system")
    )
    assert json_of(sys)["schedule"]["organizationId"] == ORG_A


def test_a_template_for_another_organisation_is_403(api: Api) -> None:
    other = {
        "agentId": "factory",
        "payload": {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": ORG_B}},
    }
    response = create(api, job=other)
    assert response.status_code == 403


def test_patch_pause_resume_delete(api: Api) -> None:
    create(api)
    patched = api.client.patch(
        "/schedules/nightly", json={"cron": None, "intervalMs": 300000}, headers=api.headers()
    )
    s = json_of(patched)["schedule"]
    assert patched.status_code == 200 and (s["cron"], s["intervalMs"], s["seq"]) == (None, 300000, 2)
    paused = json_of(
        api.client.post("/schedules/nightly/pause", json={"reason": "holiday"}, headers=api.headers())
    )
    assert (
        paused["schedule"]["status"],
        paused["schedule"]["pausedReason"],
        paused["schedule"]["nextFireAt"],
    ) == (
        "paused",
        "holiday",
        None,
    )
    listed = json_of(api.client.get("/schedules", query_string={"status": "paused"}, headers=api.headers()))
    assert [x["id"] for x in listed["schedules"]] == ["nightly"]
    resumed = json_of(api.client.post("/schedules/nightly/resume", headers=api.headers()))["schedule"]
    assert resumed["status"] == "active" and resumed["nextFireAt"] is not None
    deleted = api.client.delete("/schedules/nightly", headers=api.headers())
    assert deleted.status_code == 200 and json_of(deleted)["schedule"]["status"] == "deleted"
    assert api.client.get("/schedules/nightly", headers=api.headers()).status_code == 404
    assert json_of(api.client.get("/schedules", headers=api.headers()))["schedules"] == []


def test_trigger_and_the_fires_with_their_jobs(api: Api) -> None:
    create(api)
    triggered = api.client.post("/schedules/nightly/trigger", json={}, headers=api.headers())
    out = json_of(triggered)
    assert triggered.status_code == 202 and out["outcome"] == "fired"
    job = out["job"]
    assert (
        job["id"].startswith("nightly:") and job["payload"]["goal"] == "report" and job["status"] == "queued"
    )
    # The job id has the reserved shape: no client can post it, and the job is A's own.
    assert api.client.get(f"/jobs/{job['id']}", headers=api.headers()).status_code == 200
    skipped = json_of(api.client.post("/schedules/nightly/trigger", json={}, headers=api.headers()))
    assert (skipped["outcome"], skipped["job"]) == ("skipped", None)
    fires = json_of(api.client.get("/schedules/nightly/fires", headers=api.headers()))
    assert [(f["type"], f["trigger"], f.get("reason")) for f in fires["fires"]] == [
        ("schedule.skipped", "trigger", "overlap"),
        ("schedule.fired", "trigger", None),
    ]
    assert fires["fires"][1]["job"]["id"] == job["id"] and fires["fires"][1]["jobStatus"] == "queued"


def test_backfill_twice_is_one_job_per_tick(api: Api) -> None:
    create(api, cron="0 0 * * *", timeZone="UTC")
    span = {"startAt": "2026-01-01T00:00:00Z", "endAt": "2026-01-03T12:00:00Z"}
    first = json_of(api.client.post("/schedules/nightly/backfill", json=span, headers=api.headers()))
    assert [j["id"] for j in first["created"]] == [
        "nightly:20260101T000000Z",
        "nightly:20260102T000000Z",
        "nightly:20260103T000000Z",
    ]
    receipts = api.receipt_count()
    second = json_of(api.client.post("/schedules/nightly/backfill", json=span, headers=api.headers()))
    assert second["created"] == [] and sorted(second["existing"]) == [j["id"] for j in first["created"]]
    assert api.receipt_count() == receipts
    future = api.client.post(
        "/schedules/nightly/backfill",
        json={"startAt": "2026-01-01T00:00:00Z", "endAt": "2999-01-01T00:00:00Z"},
        headers=api.headers(),
    )
    assert future.status_code == 400 and json_of(future)["error"]["details"]["field"] == "endAt"


def test_the_pass_fire_shows_on_the_list(api: Api) -> None:
    create(api, scheduleId="every-second", cron="* * * * * *", overlap="allow", timeZone="UTC")
    from tests.support.waiting import wait_for

    def fired() -> bool:
        service.run_pass(api.queue)
        s = json_of(api.client.get("/schedules/every-second", headers=api.headers()))["schedule"]
        return bool(s["lastOutcome"])

    wait_for(fired, 10, interval=0.2, what="a fire")
    listed = json_of(api.client.get("/schedules", headers=api.headers()))["schedules"]
    s = next(x for x in listed if x["id"] == "every-second")
    assert s["lastOutcome"]["type"] == "fired" and s["nextFireAt"] > s["lastOutcome"]["tick"]
