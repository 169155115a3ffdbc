"""GET /jobs/<jobId> and GET /jobs: reading one job, and pages of jobs newest first."""

from __future__ import annotations

import base64

import pytest

from app.jobs.validation import EnqueueRequest
from app.jobs.vocab import STATUSES
from tests.support.api import ORG_A, Api, as_posted, json_of, key, payload
from tests.support.queue_ops import complete

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone


def test_get_job(api: Api) -> None:
    job = api.job()
    response = api.client.get(f"/jobs/{job['id']}", headers=api.headers())
    assert response.status_code == 200
    assert {"job": as_posted(json_of(response)["job"])} == {"job": job}
    assert json_of(response)["job"]["waiting"] == {"reason": "share", "key": None}


def test_get_reflects_worker_progress(api: Api) -> None:
    job = api.job()
    attempt = api.lease_and_start(key(job))
    api.queue.progress(key(job), "worker-1", attempt, {"pct": 50})
    got = json_of(api.client.get(f"/jobs/{job['id']}", headers=api.headers()))["job"]
    assert got["status"] == "running"
    assert got["lease"]["workerId"] == "worker-1"
    assert got["lease"]["attempt"] == 1
    assert got["progress"] == {"pct": 50}
    complete(api.queue, key(job), "worker-1", attempt, {"ok": True})
    done = json_of(api.client.get(f"/jobs/{job['id']}", headers=api.headers()))["job"]
    assert (done["status"], done["result"], done["lease"]) == ("completed", {"ok": True}, None)


def test_unknown_job_is_404(api: Api) -> None:
    response = api.client.get("/jobs/no-such-job", headers=api.headers())
    assert response.status_code == 404
    assert json_of(response)["error"]["code"] == "not_found"


def test_list_is_newest_first_with_a_cursor(api: Api) -> None:
    ids = [api.job()["id"] for _ in range(5)]
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        query = {"limit": "2"} | ({"cursor": cursor} if cursor else {})
        response = api.client.get("/jobs", query_string=query, headers=api.headers())
        assert response.status_code == 200
        body = response.json
        assert body is not None
        seen += [j["id"] for j in body["jobs"]]
        pages += 1
        cursor = body["nextCursor"]
        if cursor is None:
            break
    assert seen == list(reversed(ids))
    assert pages == 3


def test_list_filters(api: Api) -> None:
    chat = api.job(lane="chat", sessionKey="s1")
    codex = api.job(agent="codex", sessionKey="s2")
    running = api.job(agent="codex")
    api.lease_and_start(key(running))

    def ids(**query: str) -> list[str]:
        response = api.client.get("/jobs", query_string=query, headers=api.headers())
        assert response.status_code == 200, response.json
        return [j["id"] for j in json_of(response)["jobs"]]

    assert ids(lane="chat") == [chat["id"]]
    assert ids(agentId="codex") == [running["id"], codex["id"]]
    assert ids(sessionKey="s2") == [codex["id"]]
    assert ids(status="running") == [running["id"]]
    assert ids(status="queued", agentId="codex") == [codex["id"]]
    assert ids(status="failed") == []


def test_list_default_limit_is_50(api: Api) -> None:
    for _ in range(51):
        api.queue.enqueue(_request())
    body = api.client.get("/jobs", headers=api.headers()).json
    assert body is not None
    assert len(body["jobs"]) == 50
    assert body["nextCursor"] is not None


def _request() -> EnqueueRequest:
    from app.jobs.validation import validate_enqueue

    return validate_enqueue("factory", {"payload": payload()})


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "501"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"limit": "1.5"}, "limit"),
        ({"status": "done"}, "status"),
        ({"lane": "express"}, "lane"),
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"agentId": "x\x00y"}, "agentId"),
    ],
)
def test_list_rejects_bad_query_parameters(sqlite_api: Api, query: dict[str, str], field: str) -> None:
    response = sqlite_api.client.get("/jobs", query_string=query, headers=sqlite_api.headers())
    assert response.status_code == 400
    error = json_of(response)["error"]
    assert error["code"] == "invalid_field"
    assert error["details"]["field"] == field


def test_list_status_error_names_the_allowed_statuses(sqlite_api: Api) -> None:
    response = sqlite_api.client.get("/jobs?status=done", headers=sqlite_api.headers())
    assert json_of(response)["error"]["details"]["allowed"] == list(STATUSES)


def test_forged_cursor_with_a_nul_is_400(sqlite_api: Api) -> None:
    cursor = base64.urlsafe_b64encode(b"2026-01-01T00:00:00.000000Z|a\x00b").decode().rstrip("=")
    response = sqlite_api.client.get("/jobs", query_string={"cursor": cursor}, headers=sqlite_api.headers())
    assert response.status_code == 400


def test_list_is_scoped_to_the_callers_organisation(api: Api) -> None:
    mine = api.job("a")
    theirs = api.job("b")
    a_ids = [j["id"] for j in json_of(api.client.get("/jobs", headers=api.headers("a")))["jobs"]]
    b_ids = [j["id"] for j in json_of(api.client.get("/jobs", headers=api.headers("b")))["jobs"]]
    assert a_ids == [mine["id"]]
    assert b_ids == [theirs["id"]]


def test_system_token_lists_every_organisation_or_one(api: Api) -> None:
    mine = api.job("a")
    theirs = api.job("b")
    watchdog = api.job("system", payload={"kind": "factory.objective.watchdog"})
    every = json_of(api.client.get("/jobs", headers=api.headers("system")))["jobs"]
    assert [j["id"] for j in every] == [watchdog["id"], theirs["id"], mine["id"]]
    only_a = api.client.get("/jobs", query_string={"organizationId": ORG_A}, headers=api.headers("system"))
    assert [j["id"] for j in json_of(only_a)["jobs"]] == [mine["id"]]


def test_normal_token_may_not_list_another_organisation(api: Api) -> None:
    api.job("b")
    response = api.client.get("/jobs", query_string={"organizationId": "org-b"}, headers=api.headers("a"))
    assert response.status_code == 403
    own = api.client.get("/jobs", query_string={"organizationId": ORG_A}, headers=api.headers("a"))
    assert own.status_code == 200


def test_undocumented_query_parameters_are_400_naming_them(sqlite_api: Api) -> None:
    job = sqlite_api.job()
    for url in (
        "/jobs?stauts=queued",
        f"/jobs/{job['id']}?verbose=1",
        f"/streams/{job['stream']}/receipts?from=1",
    ):
        response = sqlite_api.client.get(url, headers=sqlite_api.headers())
        assert response.status_code == 400, url
        assert json_of(response)["error"]["details"]["field"] in ("stauts", "verbose", "from")
    listed = json_of(sqlite_api.client.get("/jobs?stauts=queued", headers=sqlite_api.headers()))
    assert "status" in listed["error"]["details"]["allowed"]
