"""POST /jobs:batch: many jobs in one transaction, each item checked first, all or none written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from tests.support.api import ORG_A, Api, build_api, json_of, key, make_settings, payload

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone

BATCH = "/jobs:batch"


def item(job_id: str | None = None, agent: str = "factory", **body: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"agentId": agent, "payload": body.pop("payload", payload()), **body}
    if job_id is not None:
        out["jobId"] = job_id
    return out


def post(api: Api, items: list[dict[str, Any]], who: str = "a") -> Any:
    return api.client.post(BATCH, json={"items": items}, headers=api.headers(who))


def test_a_batch_enqueues_every_item_in_order_and_answers_each(api: Api) -> None:
    before = api.receipt_count()
    response = post(api, [item("b-1"), item("b-2", agent="codex-like", lane="chat"), item()])
    assert response.status_code == 202
    jobs = json_of(response)["jobs"]
    assert [(j["index"], j["created"], j["steered"]) for j in jobs] == [
        (0, True, False),
        (1, True, False),
        (2, True, False),
    ]
    assert [j["job"]["id"] for j in jobs[:2]] == ["b-1", "b-2"]
    assert jobs[1]["job"]["lane"] == "chat" and jobs[1]["job"]["agentId"] == "codex-like"
    assert all(j["job"]["organizationId"] == ORG_A and j["job"]["status"] == "queued" for j in jobs)
    assert api.receipt_count() == before + 3
    assert [j.id for j in api.woken] == [key(j["job"]) for j in jobs]  # delivery woken for each


def test_an_invalid_item_refuses_the_whole_batch_naming_its_index_and_writes_nothing(api: Api) -> None:
    before = api.receipt_count()
    bad = item("b-ok-1", payload={"kind": "factory.unknown", "authContext": payload()["authContext"]})
    response = post(api, [item("b-ok-0"), bad])
    assert response.status_code == 400
    error = json_of(response)["error"]
    assert error["code"] == "invalid_field" and error["details"]["field"].startswith("items[1]")
    assert api.receipt_count() == before
    assert api.client.get("/jobs/b-ok-0", headers=api.headers()).status_code == 404
    # A reserved id shape and a missing agent are named by their index too.
    for items in ([item("ok"), item("obj:control:1")], [item("ok"), {"payload": payload()}]):
        response = post(api, items)
        assert response.status_code == 400, response.json
        assert json_of(response)["error"]["details"]["field"].startswith("items[1]")
    assert api.receipt_count() == before


def test_an_item_the_caller_may_not_post_refuses_the_batch_with_its_index(api: Api) -> None:
    before = api.receipt_count()
    other_org = item(payload=payload(org="org-b"))
    response = post(api, [item("b-x"), other_org])
    assert response.status_code == 403
    assert json_of(response)["error"]["details"]["index"] == 1
    assert json_of(response)["error"]["message"].startswith("items[1]: ")
    assert api.receipt_count() == before


def test_a_batch_is_idempotent_by_job_id_and_one_id_twice_is_one_job(api: Api) -> None:
    first = json_of(post(api, [item("i-1"), item("i-1"), item("i-2")]))["jobs"]
    assert [j["created"] for j in first] == [True, False, True]
    assert first[0]["job"] == first[1]["job"]
    count = api.receipt_count()
    again = json_of(post(api, [item("i-2"), item("i-1")]))["jobs"]
    assert [j["created"] for j in again] == [False, False]
    assert [j["job"]["id"] for j in again] == ["i-2", "i-1"]
    assert api.receipt_count() == count  # a re-posted batch writes nothing
    # Another organisation's batch of the same ids is its own jobs.
    theirs = json_of(post(api, [item("i-1", payload=payload(org="org-b"))], who="b"))["jobs"]
    assert theirs[0]["created"] is True and theirs[0]["job"]["organizationId"] == "org-b"


def test_singleton_rules_apply_per_item_in_order(api: Api) -> None:
    session = {"sessionKey": "s-batch"}
    jobs = json_of(
        post(
            api,
            [
                item("s-1", **session),
                item("s-2", singletonMode="steer", **session),  # steers s-1
                item("s-3", singletonMode="cancel", **session),  # cancels s-1, then is created
            ],
        )
    )["jobs"]
    assert [(j["created"], j["steered"]) for j in jobs] == [(True, False), (False, True), (True, False)]
    assert jobs[1]["job"]["id"] == "s-1" and jobs[1]["job"]["commands"][0]["type"] == "steer"
    s1 = json_of(api.client.get("/jobs/s-1", headers=api.headers()))["job"]
    assert s1["status"] == "canceled"


def test_a_failure_inside_the_transaction_writes_nothing(engine: Engine, tmp_path: Path) -> None:
    """Atomicity: the third item's steer meets the job's command cap inside the transaction."""
    api = build_api(engine, make_settings(tmp_path, max_commands_per_job=1))
    session = {"sessionKey": "s-cap", "singletonMode": "steer"}
    assert post(api, [item("cap-0", sessionKey="s-cap")]).status_code == 202
    before = api.receipt_count()
    response = post(api, [item("cap-new"), item("cap-1", **session), item("cap-2", **session)])
    assert response.status_code == 409 and json_of(response)["error"]["code"] == "too_many_commands"
    assert api.receipt_count() == before  # the first item and the first steer rolled back too
    assert api.client.get("/jobs/cap-new", headers=api.headers()).status_code == 404


def test_the_batch_size_is_bounded_and_every_item_counts_against_the_write_limit(
    engine: Engine, tmp_path: Path
) -> None:
    api = build_api(engine, make_settings(tmp_path, batch_max=3, rate_limit_writes="5/minute"))
    response = post(api, [item() for _ in range(4)])
    assert response.status_code == 400
    error = json_of(response)["error"]
    assert error["details"]["field"] == "items" and "RECEIPT_BATCH_MAX" in error["message"]
    assert post(api, []).status_code == 400  # an empty batch says so
    assert post(api, [item() for _ in range(3)]).status_code == 202  # 3 of the 5 writes (4 with the 400s)
    refused = post(api, [item() for _ in range(3)])
    assert refused.status_code == 429 and refused.headers["Retry-After"]
