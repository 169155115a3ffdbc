"""POST /agents/<agentId>/jobs: the 202 shape, idempotency per organisation, singletons, rules."""

from __future__ import annotations

from typing import Any

import pytest

from app.jobs.ids import SYSTEM_ORGANIZATION
from app.jobs.kinds import PAYLOAD_KINDS
from app.storage import store
from tests.support.api import ORG_A, ORG_B, Api, as_posted, auth_context, json_of, key, payload

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone


def test_enqueue_returns_202_with_job_route_and_async_block(api: Api) -> None:
    response = api.enqueue(agent="factory", lane="chat", sessionKey="s-1", maxAttempts=5)
    assert response.status_code == 202
    body = response.json
    assert body is not None
    job = body["job"]
    assert job["agentId"] == "factory"
    assert job["lane"] == "chat"
    assert job["status"] == "queued"
    assert job["sessionKey"] == "s-1"
    assert job["singletonMode"] == "allow"
    assert job["maxAttempts"] == 5
    assert job["attempt"] == 0
    assert job["lease"] is None
    assert job["abortRequested"] is False
    assert job["commands"] == []
    assert job["result"] is None and job["error"] is None
    assert job["createdAt"] and job["updatedAt"]
    assert job["organizationId"] == ORG_A
    assert job["stream"] == f"jobs/{ORG_A}/{job['id']}"
    assert job["payload"] == payload()
    # factory.run posted to agent "factory": the chat group, and the kind contract agrees or not.
    assert set(job["route"]) == {"workerGroup", "queue", "contractWorkerGroup", "agreesWithContract"}
    assert job["route"]["workerGroup"] == "chat"
    assert job["route"]["queue"] == "receipt-chat"
    assert body["async"] == {
        "jobId": job["id"],
        "stream": f"jobs/{ORG_A}/{job['id']}",
        "jobEventsUrl": f"/jobs/{job['id']}/events",
        "receiptEventsUrl": f"/streams/{job['stream']}/events",
        "status": "queued",
    }
    assert response.headers["Location"] == f"/jobs/{job['id']}"
    assert [j.id for j in api.woken] == [key(job)]


def test_defaults_and_clamping(api: Api) -> None:
    job = api.job()
    assert (job["lane"], job["singletonMode"], job["maxAttempts"]) == ("collect", "allow", 2)
    assert api.job(maxAttempts=99)["maxAttempts"] == 8
    assert api.job(maxAttempts=0)["maxAttempts"] == 1
    nulls = api.job(lane=None, singletonMode=None, maxAttempts=None, sessionKey=None, jobId=None)
    assert (nulls["lane"], nulls["singletonMode"], nulls["maxAttempts"]) == ("collect", "allow", 2)


def test_routing_is_agent_first(api: Api) -> None:
    codex = api.job(agent="codex")
    assert codex["route"]["workerGroup"] == "codex"
    objective = api.objective()
    control = api.job(
        agent="factory-control", payload=payload("factory.objective.control", objectiveId=objective["id"])
    )
    assert control["route"]["queue"] == "receipt-control"
    # Integration kinds run commands: the system token may post them.
    integration = api.job("system", agent="factory", payload=payload("factory.integration.publish"))
    assert integration["route"]["workerGroup"] == "codex"
    dispatch = api.job(agent="factory", payload=payload("factory.dispatch"))
    assert dispatch["route"]["workerGroup"] == "chat"
    assert dispatch["route"]["contractWorkerGroup"] == "control"
    assert dispatch["route"]["agreesWithContract"] is False


def test_unknown_agent_is_accepted(api: Api) -> None:
    before = api.receipt_count()
    job = api.job(agent="no-such-agent")
    assert job["agentId"] == "no-such-agent"
    assert job["route"]["workerGroup"] == "chat"
    assert api.receipt_count() == before + 1


def test_every_lane_is_accepted(api: Api) -> None:
    for lane in ("chat", "collect", "steer", "follow_up"):
        assert api.job(lane=lane)["lane"] == lane


def test_unknown_kind_is_400_listing_the_nine_kinds_and_writes_nothing(api: Api) -> None:
    before = api.receipt_count()
    response = api.enqueue(payload={"kind": "factory.nope", "authContext": auth_context()})
    assert response.status_code == 400
    error = json_of(response)["error"]
    assert error["code"] == "invalid_field"
    assert error["details"] == {"field": "payload.kind", "allowed": list(PAYLOAD_KINDS)}
    for kind in PAYLOAD_KINDS:
        assert kind in error["message"]
    assert api.receipt_count() == before


def test_repost_same_job_id_returns_existing_job_unchanged(api: Api) -> None:
    first = api.job(jobId="order-42", sessionKey="s")
    before = api.receipt_count()
    again = api.enqueue(jobId="order-42", lane="steer", payload=payload(note="different"))
    assert again.status_code == 202
    assert json_of(again)["job"] == first
    assert json_of(again)["async"]["jobId"] == "order-42"
    assert api.receipt_count() == before


def test_same_job_id_from_another_organisation_is_its_own_job_and_reveals_nothing(api: Api) -> None:
    mine = api.job(jobId="shared-id", sessionKey="secret-session", payload=payload(secret="s3cr3t"))
    before = api.receipt_count()
    response = api.enqueue("b", jobId="shared-id")
    assert response.status_code == 202
    theirs = json_of(response)["job"]
    assert (theirs["id"], theirs["organizationId"], theirs["stream"]) == (
        "shared-id",
        ORG_B,
        f"jobs/{ORG_B}/shared-id",
    )
    assert theirs["payload"] == payload(org=ORG_B) and theirs["sessionKey"] is None
    text = response.get_data(as_text=True)
    for leak in ("secret-session", ORG_A, "s3cr3t"):
        assert leak not in text
    assert api.receipt_count() == before + 1
    # A's job is untouched, and B's stays B's whether A's is queued or finished.
    assert as_posted(json_of(api.client.get("/jobs/shared-id", headers=api.headers()))["job"]) == mine
    api.queue.cancel(key(mine))
    again = api.enqueue("b", jobId="shared-id")
    assert again.status_code == 202
    assert json_of(again)["job"] == theirs
    assert as_posted(json_of(api.client.get("/jobs/shared-id", headers=api.headers("b")))["job"]) == theirs


def test_singleton_steer_returns_the_steered_job(api: Api) -> None:
    first = api.job(sessionKey="chat-1")
    response = api.enqueue(sessionKey="chat-1", singletonMode="steer", payload=payload(text="more"))
    assert response.status_code == 202
    steered = json_of(response)["job"]
    assert steered["id"] == first["id"]
    assert json_of(response)["async"]["jobId"] == first["id"]
    (command,) = steered["commands"]
    assert command["type"] == "steer"
    assert command["fromEnqueue"] is True
    assert command["fromSessionKey"] == "chat-1"
    assert command["payload"]["text"] == "more"


@pytest.mark.parametrize(
    ("posted", "lane"),
    [("follow_up", "follow_up"), ("steer", "steer"), ("collect", "steer"), ("chat", "steer")],
)
def test_a_steer_made_by_enqueue_keeps_the_lane_it_was_posted_with(
    api: Api, posted: str, lane: str, projection_equals_fold: Any
) -> None:
    """Spec: the queue-command lanes are steer and follow_up only. A steer enqueue posted on one of
    them steers on it; one posted on chat or collect (not a command lane) steers on ``steer``."""
    first = api.job(sessionKey="chat-1")
    response = api.enqueue(
        sessionKey="chat-1", singletonMode="steer", lane=posted, payload=payload(text="more")
    )
    (command,) = json_of(response)["job"]["commands"]
    assert (command["type"], command["lane"], command["fromEnqueue"]) == ("steer", lane, True)
    with api.engine.connect() as conn:
        receipt = store.read_stream(conn, first["stream"])[-1]
    assert (receipt.type, receipt.body["lane"]) == ("queue.command", lane)
    projection_equals_fold(api.engine, key(first))


def test_singleton_steer_does_not_cross_organisations(api: Api) -> None:
    theirs = api.job("b", sessionKey="same-key")
    mine = api.job(sessionKey="same-key", singletonMode="steer")
    assert mine["id"] != theirs["id"]
    assert json_of(api.client.get(f"/jobs/{theirs['id']}", headers=api.headers("b")))["job"]["commands"] == []


def test_singleton_cancel_stops_queued_and_aborts_running(api: Api) -> None:
    queued = api.job(sessionKey="k")
    running = api.job(sessionKey="k")
    api.lease_and_start(key(running))
    new = api.job(sessionKey="k", singletonMode="cancel")
    assert new["status"] == "queued"
    canceled = api.queue.get(key(queued))
    assert canceled is not None and canceled.status == "canceled"
    aborted = api.queue.get(key(running))
    assert aborted is not None and aborted.abort_requested and aborted.status == "running"


def test_singleton_mode_needs_a_session_key(api: Api) -> None:
    response = api.enqueue(singletonMode="cancel")
    assert response.status_code == 400
    assert json_of(response)["error"]["details"]["field"] == "sessionKey"


def test_authcontext_for_another_organisation_is_403(api: Api) -> None:
    before = api.receipt_count()
    response = api.enqueue("a", payload=payload(org=ORG_B))
    assert response.status_code == 403
    assert json_of(response)["error"]["code"] == "forbidden"
    assert api.receipt_count() == before


def test_system_token_may_enqueue_for_any_organisation(api: Api) -> None:
    job = api.job("system", payload=payload(org="org-zzz"))
    assert job["payload"]["authContext"]["organizationId"] == "org-zzz"


def test_watchdog_is_system_only_and_needs_no_authcontext(api: Api) -> None:
    watchdog = {"kind": "factory.objective.watchdog"}
    refused = api.enqueue("a", payload=watchdog)
    assert refused.status_code == 403
    refused_with_ctx = api.enqueue("a", payload={**watchdog, "authContext": auth_context()})
    assert refused_with_ctx.status_code == 403
    job = api.job("system", agent="factory-control", payload=watchdog)
    assert job["payload"] == watchdog
    assert job["organizationId"] == SYSTEM_ORGANIZATION
    # An organisation never sees a job that belongs to no organisation.
    assert api.client.get(f"/jobs/{job['id']}", headers=api.headers("a")).status_code == 404


def test_system_repost_for_a_different_organisation_is_that_organisations_job(api: Api) -> None:
    first = api.job(jobId="sys-1")
    other = api.job("system", jobId="sys-1", payload=payload(org=ORG_B))
    assert (other["id"], other["organizationId"]) == ("sys-1", ORG_B)
    assert key(other) != key(first)
    count = api.receipt_count()
    same = api.enqueue("system", jobId="sys-1", payload=payload(org=ORG_A))
    assert same.status_code == 202
    assert json_of(same)["job"] == first
    assert api.receipt_count() == count


def test_trailing_newline_job_id_is_refused(api: Api) -> None:
    response = api.enqueue(jobId="abc\n")
    assert response.status_code == 400
    assert json_of(response)["error"]["details"]["field"] == "jobId"


# -- delayed jobs -----------------------------------------------------------------------------------


def test_delay_ms_sets_available_at_on_the_database_clock(api: Api) -> None:
    from app.storage.db import parse_iso

    job = api.job(delayMs=90_000)
    created, available = parse_iso(job["createdAt"]), parse_iso(job["availableAt"])
    assert job["status"] == "queued" and created is not None and available is not None
    assert (available - created).total_seconds() == 90
    # The wake-up still fires (the scanner decides it is not yet deliverable).
    assert [j.id for j in api.woken] == [key(job)]


def test_run_at_in_the_future_is_kept_and_a_past_one_is_clamped_to_now(api: Api) -> None:
    later = api.job(runAt="2099-03-04T05:06:07+02:00")
    assert later["availableAt"] == "2099-03-04T03:06:07.000000Z"
    past = api.job(runAt="2001-01-01T00:00:00Z")
    assert past["availableAt"] == past["createdAt"]


def test_bad_delay_input_is_a_400_naming_the_field(api: Api) -> None:
    for body, field in (
        ({"runAt": "2099-03-04T05:06:07"}, "runAt"),  # no offset
        ({"runAt": "next tuesday"}, "runAt"),
        ({"delayMs": -5}, "delayMs"),
        ({"delayMs": 1000, "runAt": "2099-03-04T05:06:07Z"}, "runAt"),
    ):
        response = api.enqueue(**body)
        assert response.status_code == 400, (body, response.json)
        assert json_of(response)["error"]["details"]["field"] == field, body
