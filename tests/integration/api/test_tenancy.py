"""Organisations: ids are unique within one, so B can neither see nor touch A's job or objective,
and posting A's id makes B its own. A system token acts in another organisation only by naming it;
the ids and kinds the system derives for itself are refused at the door."""

from __future__ import annotations

from typing import Any

import pytest

from app.jobs.ids import RESERVED_JOB_ID_SHAPES, SYSTEM_ORGANIZATION
from tests.support.api import ORG_A, ORG_B, Api, as_posted, auth_context, json_of, key, payload

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone


def _snapshot(api: Api, job_id: str) -> Any:
    return json_of(api.client.get(f"/jobs/{job_id}", headers=api.headers("a")))


def _receipts(api: Api, stream: str) -> Any:
    return json_of(api.client.get(f"/streams/{stream}/receipts", headers=api.headers("system")))


def test_another_organisation_can_neither_see_nor_touch_a_job(api: Api) -> None:
    job = api.job("a", jobId="a-private", sessionKey="a-session", payload=payload(secret="a-only"))
    job_id = job["id"]
    before_receipts = api.receipt_count()
    before_job = _snapshot(api, job_id)
    before_stream = _receipts(api, job["stream"])
    b = api.headers("b")
    unknown = api.client.get("/jobs/definitely-unknown", headers=b)
    assert unknown.status_code == 404

    # Reads: identical to an unknown job, by its id or by its stream's name.
    for url in (
        f"/jobs/{job_id}",
        f"/jobs/{job_id}/events",
        f"/streams/{job['stream']}/receipts",
        f"/streams/{job['stream']}/events",
        f"/streams/jobs/{job_id}/receipts",
    ):
        response = api.client.get(url, headers=b)
        assert response.status_code == 404, url
        assert response.get_data() == unknown.get_data(), url

    # Mutations: 404 as well, and nothing written.
    for url, body in ((f"/jobs/{job_id}/commands", {"type": "abort"}), (f"/jobs/{job_id}/cancel", {})):
        response = api.client.post(url, json=body, headers=b)
        assert response.status_code == 404, url
        assert response.get_data() == unknown.get_data(), url

    # Naming A's organisation is a system token's right only.
    named = api.client.get(f"/jobs/{job_id}", query_string={"organizationId": ORG_A}, headers=b)
    assert named.status_code == 403 and json_of(named)["error"]["code"] == "forbidden"
    assert "a-only" not in named.get_data(as_text=True)

    # Lists exclude it, whatever the filters.
    for query in ({}, {"sessionKey": "a-session"}, {"agentId": "factory"}, {"status": "queued"}):
        listed = api.client.get("/jobs", query_string=query, headers=b).json
        assert listed == {"jobs": [], "nextCursor": None}, query
    assert api.client.get("/jobs", query_string={"organizationId": ORG_A}, headers=b).status_code == 403
    assert api.receipt_count() == before_receipts

    # Enqueue with A's jobId: B's own job of that id, saying nothing about A's.
    reuse = api.client.post(
        "/agents/factory/jobs", json={"jobId": job_id, "payload": payload(org=ORG_B)}, headers=b
    )
    assert reuse.status_code == 202
    theirs = json_of(reuse)["job"]
    assert (theirs["id"], theirs["organizationId"], theirs["stream"]) == (
        job_id,
        ORG_B,
        f"jobs/{ORG_B}/{job_id}",
    )
    assert (theirs["status"], theirs["seq"], theirs["sessionKey"]) == ("queued", 1, None)
    assert "a-only" not in reuse.get_data(as_text=True) and ORG_A not in reuse.get_data(as_text=True)
    assert json_of(reuse)["async"]["jobEventsUrl"] == f"/jobs/{job_id}/events"
    # From now on B's reads and writes of that id reach B's job, never A's.
    assert as_posted(json_of(api.client.get(f"/jobs/{job_id}", headers=b))["job"]) == theirs
    canceled = api.client.post(f"/jobs/{job_id}/cancel", json={"reason": "mine"}, headers=b)
    assert canceled.status_code == 202
    assert (json_of(canceled)["job"]["organizationId"], json_of(canceled)["job"]["status"]) == (
        ORG_B,
        "canceled",
    )

    # A steer or cancel on the same session key does not reach A's job either.
    steer = api.client.post(
        "/agents/factory/jobs",
        headers=b,
        json={"sessionKey": "a-session", "singletonMode": "steer", "payload": payload(org=ORG_B)},
    )
    assert steer.status_code == 202
    assert json_of(steer)["job"]["organizationId"] == ORG_B and json_of(steer)["job"]["id"] != job_id
    cancel_all = api.client.post(
        "/agents/factory/jobs",
        headers=b,
        json={"sessionKey": "a-session", "singletonMode": "cancel", "payload": payload(org=ORG_B)},
    )
    assert cancel_all.status_code == 202
    # Posting on A's behalf is forbidden outright.
    assert (
        api.client.post("/agents/factory/jobs", json={"payload": payload(org=ORG_A)}, headers=b).status_code
        == 403
    )

    # A's job is exactly as it was, receipt for receipt. The only receipts written were B's own:
    # three enqueues, the cancel of B's "a-private", and B's cancel-singleton canceling B's steer job.
    assert _snapshot(api, job_id) == before_job
    assert _receipts(api, job["stream"]) == before_stream
    assert api.receipt_count() == before_receipts + 5
    b_steered = json_of(api.client.get(f"/jobs/{json_of(steer)['job']['id']}", headers=b))
    assert b_steered["job"]["status"] == "canceled"


def test_another_organisation_can_neither_see_nor_touch_an_objective(api: Api) -> None:
    mine = api.objective("a", objectiveId="shared-obj", title="A's plan")
    b = api.headers("b")
    unknown = api.client.get("/objectives/definitely-unknown", headers=b)
    assert unknown.status_code == 404
    for url in (
        "/objectives/shared-obj",
        "/objectives/shared-obj/events",
        f"/streams/{mine['stream']}/receipts",
        f"/streams/{mine['stream']}/events",
    ):
        response = api.client.get(url, headers=b)
        assert response.status_code == 404, url
        assert response.get_data() == unknown.get_data(), url
    cancel = api.client.post("/objectives/shared-obj/cancel", json={}, headers=b)
    assert cancel.status_code == 404 and cancel.get_data() == unknown.get_data()
    before_stream = _receipts(api, mine["stream"])

    # Launching A's objectiveId launches B's own objective of that id.
    theirs = api.objective("b", objectiveId="shared-obj", title="B's plan")
    assert (theirs["id"], theirs["organizationId"], theirs["stream"], theirs["title"]) == (
        "shared-obj",
        ORG_B,
        f"objectives/{ORG_B}/shared-obj",
        "B's plan",
    )
    assert json_of(api.client.get("/objectives/shared-obj", headers=b))["objective"]["title"] == "B's plan"
    again = json_of(api.client.get("/objectives/shared-obj", headers=api.headers("a")))["objective"]
    assert (again["organizationId"], again["title"], again["tasks"]) == (ORG_A, "A's plan", mine["tasks"])
    assert _receipts(api, mine["stream"]) == before_stream


def test_a_system_token_reads_another_organisations_job_only_by_naming_it(api: Api) -> None:
    assert api.job("a", jobId="a-job")["organizationId"] == ORG_A
    system = api.headers("system")
    unknown = api.client.get("/jobs/definitely-unknown", headers=system)
    # In its own organisation, A's id is an unknown id.
    for url in ("/jobs/a-job", "/jobs/a-job/events"):
        response = api.client.get(url, headers=system)
        assert response.status_code == 404 and response.get_data() == unknown.get_data(), url
    named = {"organizationId": ORG_A}
    response = api.client.get("/jobs/a-job", query_string=named, headers=system)
    assert response.status_code == 200
    assert json_of(response)["job"] == _snapshot(api, "a-job")["job"]
    # A's own token may name its own organisation; B's may not name A's.
    own = api.client.get("/jobs/a-job", query_string=named, headers=api.headers("a"))
    assert own.status_code == 200 and json_of(own)["job"] == json_of(response)["job"]
    assert api.client.get("/jobs/a-job", query_string=named, headers=api.headers("b")).status_code == 403
    # A job the system enqueued for itself lives in the reserved organisation.
    tick = api.job("system", agent="factory-control", payload={"kind": "factory.objective.watchdog"})
    assert tick["organizationId"] == SYSTEM_ORGANIZATION
    assert api.client.get(f"/jobs/{tick['id']}", headers=system).status_code == 404
    found = api.client.get(
        f"/jobs/{tick['id']}", query_string={"organizationId": SYSTEM_ORGANIZATION}, headers=system
    )
    assert found.status_code == 200 and json_of(found)["job"]["id"] == tick["id"]


def test_owner_and_system_can_see_and_act_on_it(api: Api) -> None:
    job = api.job("a")
    for who, query in (("a", {}), ("system", {"organizationId": ORG_A})):
        headers = api.headers(who)
        assert api.client.get(f"/jobs/{job['id']}", query_string=query, headers=headers).status_code == 200
        assert api.client.get(f"/streams/{job['stream']}/receipts", headers=headers).status_code == 200
    system, named = api.headers("system"), {"organizationId": ORG_A}
    steered = api.client.post(
        f"/jobs/{job['id']}/commands", query_string=named, json={"type": "steer"}, headers=system
    )
    assert steered.status_code == 202
    canceled = api.client.post(f"/jobs/{job['id']}/cancel", query_string=named, headers=system)
    assert canceled.status_code == 202
    stored = api.queue.get(key(job))
    assert (
        stored is not None and stored.status == "canceled" and [c.type for c in stored.commands] == ["steer"]
    )


@pytest.mark.parametrize("who", ["a", "system"])
@pytest.mark.parametrize(
    ("job_id", "shape"),
    [
        ("obj:p1:A", "<objectiveId>:p<phase>:<taskId>"),
        ("obj:p12:task-7", "<objectiveId>:p<phase>:<taskId>"),
        ("obj:control:3", "<objectiveId>:control:<n>"),
        ("obj:audit", "<objectiveId>:audit"),
        ("obj:p1:A:monitor", "<objectiveId>:p<phase>:<taskId>"),
        ("task-job:monitor", "<taskJobId>:monitor"),
        ("watchdog:2026-01-01T00:00", "watchdog:<tick>"),
        ("nightly:20260101T090000Z", "<scheduleId>:<tick>"),
        ("nightly:20260101T090000.250Z", "<scheduleId>:<tick>"),
        # A tick decided again after a withdrawal (app.schedules.vocab.fire_client_id).
        ("nightly:20260101T090000Z-17", "<scheduleId>:<tick>"),
    ],
)
def test_reserved_id_shapes_are_400_naming_jobid_and_the_rule(
    sqlite_api: Api, who: str, job_id: str, shape: str
) -> None:
    api = sqlite_api
    before = api.receipt_count()
    response = api.enqueue(who, jobId=job_id)
    assert response.status_code == 400
    error = json_of(response)["error"]
    assert error["code"] == "invalid_field"
    assert error["details"]["field"] == "jobId"
    assert shape in error["message"]
    for listed, _pattern in RESERVED_JOB_ID_SHAPES:
        assert listed in error["message"]
    assert api.receipt_count() == before


def test_ids_that_merely_resemble_a_reserved_shape_are_accepted(sqlite_api: Api) -> None:
    for job_id in (
        "objp1A",
        "obj:p:A",
        "obj:pX:A",
        "audit:obj",
        "obj:auditor",
        "my-watchdog:1",
        "control",
        "nightly:2026-01-01T09:00:00Z",
        "nightly:20260101T090000Z-rerun",
    ):
        assert sqlite_api.job(jobId=job_id)["id"] == job_id


@pytest.mark.parametrize(
    ("kind", "agent"),
    [("factory.task.monitor", "factory-monitor"), ("factory.objective.watchdog", "factory-control")],
)
def test_monitor_and_watchdog_kinds_are_403_for_a_tenant(api: Api, kind: str, agent: str) -> None:
    objective = api.objective("a")
    before, woken = api.receipt_count(), list(api.woken)
    for body in (
        {"kind": kind, "authContext": auth_context(ORG_A)},
        {"kind": kind, "authContext": auth_context(ORG_A), "objectiveId": objective["id"], "taskId": "A"},
    ):
        response = api.enqueue("a", agent=agent, payload=body)
        assert response.status_code == 403, body
        error = json_of(response)["error"]
        assert error["code"] == "forbidden"
        assert "only system tokens" in error["message"] and kind in error["message"]
    assert api.receipt_count() == before
    assert api.woken == woken


@pytest.mark.parametrize("kind", ["factory.objective.control", "factory.objective.audit"])
def test_control_and_audit_for_a_foreign_or_missing_objective_are_the_same_403(api: Api, kind: str) -> None:
    api.objective("a", objectiveId="a-obj")
    before = api.receipt_count()

    def post(who: str, objective_id: str | None) -> Any:
        org = ORG_B if who == "b" else ORG_A
        body = (
            payload(kind, org=org)
            if objective_id is None
            else payload(kind, org=org, objectiveId=objective_id)
        )
        return api.enqueue(who, agent="factory-control", payload=body)

    foreign, missing = post("b", "a-obj"), post("b", "no-such-obj")
    assert foreign.status_code == missing.status_code == 403
    assert foreign.get_data() == missing.get_data()
    assert json_of(foreign)["error"]["code"] == "forbidden"
    assert "objectiveId" in json_of(foreign)["error"]["message"]
    unnamed = post("b", None)
    assert unnamed.status_code == 403 and "payload.objectiveId" in json_of(unnamed)["error"]["message"]
    assert api.receipt_count() == before
    # The objective's own organisation may post it.
    own = post("a", "a-obj")
    assert own.status_code == 202, own.json
    assert json_of(own)["job"]["organizationId"] == ORG_A


def test_any_kind_naming_an_objective_must_name_one_of_its_own_organisation(api: Api) -> None:
    api.objective("a", objectiveId="a-obj")
    before = api.receipt_count()
    foreign = api.enqueue("b", payload=payload("factory.run", org=ORG_B, objectiveId="a-obj"))
    missing = api.enqueue("b", payload=payload("factory.run", org=ORG_B, objectiveId="no-such-obj"))
    assert foreign.status_code == missing.status_code == 403
    assert foreign.get_data() == missing.get_data()
    assert api.receipt_count() == before
    assert api.job(payload=payload("factory.run", objectiveId="a-obj"))["payload"]["objectiveId"] == "a-obj"
