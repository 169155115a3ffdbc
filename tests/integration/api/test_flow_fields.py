"""The flow fields over HTTP (``priority``, ``concurrencyKey``, ``concurrencyLimit``, ``debounce``):
accepted by a single and a batch enqueue, shown on the job, carried by a replay; bad values are a 400
naming the field and what it allows, nothing written, and the document refuses them too."""

from __future__ import annotations

from typing import Any

import pytest
from jsonschema import Draft202012Validator
from referencing import Registry, Resource

from app.jobs.flow import (
    CONCURRENCY_LIMIT_RULE,
    DEBOUNCE_WINDOW_RULE,
    DEBOUNCE_WITH_DELAY_RULE,
    KEY_RULE,
    LIMIT_NEEDS_KEY_RULE,
    PRIORITY_RULE,
)
from tests.support.api import Api, json_of, key, payload

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone

FLOW: dict[str, Any] = {
    "priority": 7,
    "concurrencyKey": "acme:crm/sync",
    "concurrencyLimit": 3,
}
DEBOUNCE: dict[str, Any] = {"debounce": {"key": "reindex.acme", "windowMs": 60_000}}


def _doc_validator(api: Api, name: str) -> Draft202012Validator:
    document = json_of(api.client.get("/openapi.json", headers=api.headers()))
    registry: Registry[Any] = Registry().with_resource(
        "urn:doc",
        Resource.from_contents({**document, "$schema": "https://json-schema.org/draft/2020-12/schema"}),
    )
    return Draft202012Validator({"$ref": f"urn:doc#/components/schemas/{name}"}, registry=registry)


def test_an_enqueue_takes_the_flow_fields_and_the_job_shows_them(api: Api) -> None:
    job = api.job(jobId="f-1", **FLOW, **DEBOUNCE)
    expected = {**FLOW, **DEBOUNCE}
    assert {name: job.get(name) for name in expected} == expected
    assert job["status"] == "queued" and job["availableAt"] is not None  # the debounce window
    read = json_of(api.client.get("/jobs/f-1", headers=api.headers()))["job"]
    assert {name: read.get(name) for name in expected} == expected
    listed = json_of(api.client.get("/jobs", headers=api.headers()))["jobs"]
    assert [j["priority"] for j in listed if j["id"] == "f-1"] == [7]


def test_a_job_without_flow_fields_shows_none_and_nulls_are_the_defaults(api: Api) -> None:
    plain = api.job(jobId="plain")
    nulls = api.job(jobId="nulls", priority=None, concurrencyKey=None, concurrencyLimit=None, debounce=None)
    for job in (plain, nulls):
        assert not {"priority", "concurrencyKey", "concurrencyLimit", "debounce"} & set(job)
        assert job["availableAt"] is None
    # Priority 0 is the default: not shown, as nothing else at its default is.
    assert "priority" not in api.job(priority=0)


def test_each_batch_item_takes_its_own_flow_fields(api: Api) -> None:
    items = [
        {"agentId": "factory", "payload": payload(), "jobId": "b-hi", "priority": 10},
        {
            "agentId": "factory",
            "payload": payload(),
            "jobId": "b-key",
            "concurrencyKey": "k",
            "concurrencyLimit": 1,
        },
        {"agentId": "factory", "payload": payload(), "jobId": "b-plain"},
    ]
    response = api.client.post("/jobs:batch", json={"items": items}, headers=api.headers())
    assert response.status_code == 202, response.json
    jobs = [entry["job"] for entry in json_of(response)["jobs"]]
    assert jobs[0]["priority"] == 10 and "concurrencyKey" not in jobs[0]
    assert (jobs[1]["concurrencyKey"], jobs[1]["concurrencyLimit"]) == ("k", 1)
    assert "priority" not in jobs[2]


# (name, the fields posted, the field named, the reason given)
BAD: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "negative limit",
        {"concurrencyKey": "k", "concurrencyLimit": -1},
        "concurrencyLimit",
        CONCURRENCY_LIMIT_RULE,
    ),
    ("limit 0", {"concurrencyKey": "k", "concurrencyLimit": 0}, "concurrencyLimit", CONCURRENCY_LIMIT_RULE),
    (
        "limit over 1000",
        {"concurrencyKey": "k", "concurrencyLimit": 1001},
        "concurrencyLimit",
        CONCURRENCY_LIMIT_RULE,
    ),
    ("limit without a key", {"concurrencyLimit": 2}, "concurrencyLimit", LIMIT_NEEDS_KEY_RULE),
    (
        "limit with a null key",
        {"concurrencyKey": None, "concurrencyLimit": 2},
        "concurrencyLimit",
        LIMIT_NEEDS_KEY_RULE,
    ),
    ("priority above 10", {"priority": 11}, "priority", PRIORITY_RULE),
    ("priority below -10", {"priority": -11}, "priority", PRIORITY_RULE),
    ("priority as a string", {"priority": "high"}, "priority", PRIORITY_RULE),
    ("priority not whole", {"priority": 1.5}, "priority", PRIORITY_RULE),
    ("priority true", {"priority": True}, "priority", PRIORITY_RULE),
    ("over-long key", {"concurrencyKey": "k" * 129}, "concurrencyKey", KEY_RULE),
    ("key with a space", {"concurrencyKey": "a b"}, "concurrencyKey", KEY_RULE),
    ("empty key", {"concurrencyKey": ""}, "concurrencyKey", KEY_RULE),
    (
        "debounce window 0",
        {"debounce": {"key": "k", "windowMs": 0}},
        "debounce.windowMs",
        DEBOUNCE_WINDOW_RULE,
    ),
    (
        "debounce window over a day",
        {"debounce": {"key": "k", "windowMs": 86_400_001}},
        "debounce.windowMs",
        DEBOUNCE_WINDOW_RULE,
    ),
    ("debounce over-long key", {"debounce": {"key": "d" * 129, "windowMs": 5}}, "debounce.key", KEY_RULE),
    ("debounce without a window", {"debounce": {"key": "k"}}, "debounce.windowMs", "is required"),
    (
        "debounce with delayMs",
        {"debounce": {"key": "k", "windowMs": 5}, "delayMs": 10},
        "debounce",
        DEBOUNCE_WITH_DELAY_RULE,
    ),
    (
        "debounce with runAt",
        {"debounce": {"key": "k", "windowMs": 5}, "runAt": "2030-01-01T00:00:00Z"},
        "debounce",
        DEBOUNCE_WITH_DELAY_RULE,
    ),
    ("debounce as a string", {"debounce": "k"}, "debounce", "must be an object with key and windowMs"),
]


@pytest.mark.parametrize(("fields", "field", "reason"), [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_a_bad_flow_field_is_a_400_naming_it_and_nothing_is_written(
    api: Api, fields: dict[str, Any], field: str, reason: str
) -> None:
    before = api.receipt_count()
    response = api.enqueue(jobId="bad", **fields)
    assert response.status_code == 400, response.json
    error = json_of(response)["error"]
    assert error["code"] == "invalid_field"
    assert error["details"]["field"] == field
    assert error["message"] == f"{field}: {reason}"
    # The same item in a batch is named by its index, and refuses the whole batch.
    items = [{"agentId": "factory", "payload": payload(), "jobId": "ok"}]
    items.append({"agentId": "factory", "payload": payload(), "jobId": "bad", **fields})
    response = api.client.post("/jobs:batch", json={"items": items}, headers=api.headers())
    assert response.status_code == 400, response.json
    assert json_of(response)["error"]["details"]["field"] == f"items[1].{field}"
    assert api.receipt_count() == before
    for job_id in ("bad", "ok"):
        assert api.client.get(f"/jobs/{job_id}", headers=api.headers()).status_code == 404
    # The document refuses what the server refuses.
    assert not _doc_validator(api, "EnqueueRequest").is_valid({"payload": payload(), **fields})


def test_an_unknown_debounce_field_is_named_with_the_known_ones(api: Api) -> None:
    before = api.receipt_count()
    response = api.enqueue(debounce={"key": "k", "windowMs": 5, "leading": True})
    assert response.status_code == 400
    details = json_of(response)["error"]["details"]
    assert details == {"field": "debounce.leading", "allowed": ["key", "windowMs"]}
    assert api.receipt_count() == before


def test_the_document_accepts_what_the_server_accepts(api: Api) -> None:
    body = {"payload": payload(), **FLOW, **DEBOUNCE}
    assert _doc_validator(api, "EnqueueRequest").is_valid(body)
    assert api.client.post("/agents/factory/jobs", json=body, headers=api.headers()).status_code == 202
    document = json_of(api.client.get("/openapi.json", headers=api.headers()))
    properties = document["components"]["schemas"]["EnqueueRequest"]["properties"]
    for name in ("priority", "concurrencyKey", "concurrencyLimit", "debounce"):
        assert properties[name]["description"], name
    assert properties["priority"]["minimum"] == -10 and properties["priority"]["maximum"] == 10
    job = document["components"]["schemas"]["Job"]["properties"]
    assert {"priority", "concurrencyKey", "concurrencyLimit", "debounce"} <= set(job)


# -- replay --------------------------------------------------------------------------------------


def _failed(api: Api, **body: Any) -> dict[str, Any]:
    job = api.job(**body)
    assert api.queue.fail(key(job), None, None, "boom", retryable=False).job.status == "failed"
    return job


def _replay(api: Api, job_id: str, **body: Any) -> dict[str, Any]:
    response = api.client.post(f"/jobs/{job_id}/replay", json=body, headers=api.headers())
    assert response.status_code == 202, response.json
    job: dict[str, Any] = json_of(response)["job"]
    return job


def test_a_replay_keeps_the_flow_fields_unless_the_body_gives_others(api: Api) -> None:
    source = _failed(api, jobId="src", **FLOW)
    kept = _replay(api, "src", replayKey="same")
    assert {name: kept.get(name) for name in FLOW} == FLOW
    changed = _replay(api, "src", replayKey="changed", priority=-3, concurrencyLimit=9)
    assert (changed["priority"], changed["concurrencyKey"], changed["concurrencyLimit"]) == (
        -3,
        "acme:crm/sync",
        9,
    )
    # A new key does not inherit the old key's limit; a null clears a field.
    rekeyed = _replay(api, "src", replayKey="rekeyed", concurrencyKey="other", priority=None)
    assert (rekeyed["concurrencyKey"], "concurrencyLimit" in rekeyed, "priority" in rekeyed) == (
        "other",
        False,
        False,
    )
    cleared = _replay(api, "src", replayKey="cleared", concurrencyKey=None)
    assert not {"concurrencyKey", "concurrencyLimit"} & set(cleared) and cleared["priority"] == 7
    assert source["priority"] == 7


def test_a_replay_refuses_bad_flow_fields_naming_them(api: Api) -> None:
    _failed(api, jobId="src-bad")
    before = api.receipt_count()
    for body, field in (
        ({"priority": 99}, "priority"),
        ({"concurrencyLimit": 2}, "concurrencyLimit"),  # the replayed job has no key
        ({"debounce": {"key": "k", "windowMs": 0}}, "debounce.windowMs"),
    ):
        response = api.client.post("/jobs/src-bad/replay", json=body, headers=api.headers())
        assert response.status_code == 400, response.json
        assert json_of(response)["error"]["details"]["field"] == field
    assert api.receipt_count() == before


def test_a_replayed_debounced_job_waits_its_window_again(api: Api) -> None:
    _failed(api, jobId="src-d", **DEBOUNCE)
    replayed = _replay(api, "src-d")
    assert replayed["debounce"] == DEBOUNCE["debounce"] and replayed["availableAt"] is not None


def test_a_bulk_replay_keeps_each_job_s_flow_fields(api: Api) -> None:
    _failed(api, jobId="bulk-1", tags={"run": "flow"}, priority=4, concurrencyKey="k1")
    _failed(api, jobId="bulk-2", tags={"run": "flow"})
    response = api.client.post(
        "/jobs:bulk",
        json={
            "action": "replay",
            "filter": {"tag": "run:flow", "status": "failed"},
            "idempotencyKey": "flow-op",
        },
        headers=api.headers(),
    )
    assert response.status_code == 200 and json_of(response)["affected"] == 2, response.json
    replays = json_of(api.client.get("/jobs?status=queued&tag=run:flow", headers=api.headers()))["jobs"]
    by_source = {j["replayOf"].rsplit("/", 1)[1]: j for j in replays}
    assert (by_source["bulk-1"]["priority"], by_source["bulk-1"]["concurrencyKey"]) == (4, "k1")
    assert not {"priority", "concurrencyKey"} & set(by_source["bulk-2"])
