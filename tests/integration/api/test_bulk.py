"""POST /jobs:bulk: cancel or replay every job a filter selects, with a dry run, an idempotency key,
a cap per call resumed by a cursor, a receipt per job and an audit stream per operation."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.ops.bulk_actions import operation_stream
from app.storage import store
from tests.support.api import ORG_A, ORG_B, Api, json_of, key, payload


def _bulk(api: Api, who: str = "a", **body: Any) -> Any:
    return api.client.post("/jobs:bulk", json=body, headers=api.headers(who))


def _failed(api: Api, n: int, tag: str, who: str = "a") -> list[dict[str, Any]]:
    made = []
    for _ in range(n):
        org = ORG_B if who == "b" else ORG_A
        job = api.job(who, payload=payload(org=org), tags={"run": tag})
        api.queue.fail(key(job), None, None, "command exited with 1", retryable=False)
        made.append(job)
    return made


def _stream(api: Api, stream: str) -> list[tuple[str, Mapping[str, Any]]]:
    with api.engine.connect() as conn:
        return [(r.type, r.body) for r in store.read_stream(conn, stream)]


def test_a_dry_run_counts_and_samples_and_writes_nothing(api: Api) -> None:
    made = _failed(api, 3, "dry")
    api.job(tags={"run": "dry"})  # queued: not failed
    count = api.receipt_count()
    response = _bulk(api, action="replay", filter={"tag": "run:dry", "status": "failed"}, dryRun=True)
    assert response.status_code == 200, response.json
    body = json_of(response)
    assert body["count"] == 3
    assert {j["id"] for j in body["sample"]} == {j["id"] for j in made}
    assert api.receipt_count() == count


def test_a_bulk_replay_pages_resumes_and_is_idempotent(api: Api) -> None:
    made = _failed(api, 5, "r")
    _failed(api, 2, "r", who="b")  # another organisation's: never reached
    flt = {"tag": "run:r", "status": "failed"}
    first = json_of(_bulk(api, action="replay", filter=flt, idempotencyKey="op-1", limit=3))
    assert (first["matched"], first["processed"], first["affected"], first["done"]) == (5, 3, 3, False)
    count = api.receipt_count()
    again = json_of(_bulk(api, action="replay", filter=flt, idempotencyKey="op-1", limit=3))
    assert again["repeated"] is True and again["nextCursor"] == first["nextCursor"]
    assert api.receipt_count() == count  # a retried page writes nothing
    rest = json_of(
        _bulk(api, action="replay", filter=flt, idempotencyKey="op-1", limit=3, cursor=first["nextCursor"])
    )
    assert (rest["processed"], rest["affected"], rest["done"], rest["nextCursor"]) == (5, 5, True, None)
    # Exactly one new job per failed one, each linked both ways, all in A.
    replays = json_of(
        api.client.get("/jobs", query_string={"tag": "run:r", "status": "queued"}, headers=api.headers())
    )
    assert sorted(j["replayOf"] for j in replays["jobs"]) == sorted(key(j) for j in made)
    for job in made:
        shown = json_of(api.client.get(f"/jobs/{job['id']}", headers=api.headers()))["job"]
        assert len(shown["replayedAs"]) == 1
    audit = _stream(api, operation_stream(ORG_A, "op-1"))
    assert [t for t, _ in audit] == ["operation.started", "operation.page", "operation.page"]
    started = audit[0][1]
    assert started["action"] == "replay" and started["filter"] == flt and started["matched"] == 5
    assert started["by"]["tokenId"] is not None
    # The same key for another action or filter is a conflict, never a second operation.
    other = _bulk(api, action="cancel", filter=flt, idempotencyKey="op-1")
    assert other.status_code == 409


def test_a_bulk_cancel_cancels_each_job_with_its_own_receipt(api: Api) -> None:
    queued = [api.job(tags={"run": "c"}) for _ in range(3)]
    done = _failed(api, 1, "c")
    body = json_of(
        _bulk(api, action="cancel", filter={"tag": "run:c"}, idempotencyKey="cancel-1", reason="bulk")
    )
    assert (body["matched"], body["affected"], body["skipped"], body["done"]) == (4, 3, 1, True)
    for job in queued:
        shown = json_of(api.client.get(f"/jobs/{job['id']}", headers=api.headers()))["job"]
        assert shown["status"] == "canceled"
        assert _stream(api, shown["stream"])[-1][0] == "job.canceled"
    assert (
        json_of(api.client.get(f"/jobs/{done[0]['id']}", headers=api.headers()))["job"]["status"] == "failed"
    )


def test_a_system_token_names_the_organisation_it_acts_in(api: Api) -> None:
    _failed(api, 2, "s")
    _failed(api, 1, "s", who="b")
    response = api.client.post(
        "/jobs:bulk",
        query_string={"organizationId": ORG_B},
        json={"action": "replay", "filter": {"tag": "run:s"}, "dryRun": True},
        headers=api.headers("system"),
    )
    assert json_of(response)["count"] == 1
    # An organisation's token may not name another.
    foreign = api.client.post(
        "/jobs:bulk",
        query_string={"organizationId": ORG_B},
        json={"action": "replay", "filter": {}, "dryRun": True},
        headers=api.headers("a"),
    )
    assert foreign.status_code == 403


def test_bad_bulk_requests_are_a_400_naming_the_field(api: Api) -> None:
    count = api.receipt_count()
    allowed = json_of(_bulk(api, action="delete", filter={}, dryRun=True))["error"]["details"]["allowed"]
    assert allowed == ["cancel", "replay", "archive"]  # a closed set: the 400 lists it
    kinds = _bulk(api, action="replay", filter={"kind": "nope"}, dryRun=True)
    assert "factory.task.run" in json_of(kinds)["error"]["details"]["allowed"]
    for body, field in (
        ({"action": "delete", "filter": {}, "dryRun": True}, "action"),
        ({"action": "replay", "filter": {"status": "done"}, "dryRun": True}, "filter.status"),
        ({"action": "replay", "filter": {"createdAfter": "monday"}, "dryRun": True}, "filter.createdAfter"),
        ({"action": "replay", "filter": {"errorPrefix": ""}, "dryRun": True}, "filter.errorPrefix"),
        ({"action": "archive", "filter": [], "dryRun": True}, "filter"),
        ({"action": "archive", "filter": {}, "dryRun": "yes"}, "dryRun"),
        ({"action": "replay", "filter": {"kind": "nope"}, "dryRun": True}, "filter.kind"),
        ({"action": "replay", "filter": {"tag": "x"}, "dryRun": True}, "filter.tag"),
        ({"action": "replay", "filter": {"colour": "red"}, "dryRun": True}, "filter.colour"),
        ({"action": "replay", "filter": {}}, "idempotencyKey"),
        ({"action": "replay", "filter": {}, "idempotencyKey": "k", "limit": 1001}, "limit"),
        ({"action": "replay", "filter": {}, "idempotencyKey": "bad key"}, "idempotencyKey"),
    ):
        response = _bulk(api, **body)
        assert response.status_code == 400, (body, response.json)
        assert json_of(response)["error"]["details"]["field"] == field, (body, response.json)
    assert api.receipt_count() == count


def test_the_longest_idempotency_key_still_replays(api: Api) -> None:
    made = _failed(api, 2, "long")
    longest = "k" * 60  # the pattern's cap: its replay key (op:<key>) is still a valid one
    body = json_of(_bulk(api, action="replay", filter={"tag": "run:long"}, idempotencyKey=longest))
    assert (body["affected"], body["skipped"]) == (2, 0)
    assert len(made) == 2


def test_a_limit_written_as_a_whole_float_is_that_many_jobs(api: Api) -> None:
    """JSON Schema counts 2.0 as an integer, so the document allows it: the server takes it too."""
    _failed(api, 3, "float")
    response = _bulk(api, action="replay", filter={"tag": "run:float"}, idempotencyKey="op-float", limit=2.0)
    assert response.status_code == 200, response.json
    assert json_of(response)["processed"] == 2 and json_of(response)["nextCursor"] is not None
