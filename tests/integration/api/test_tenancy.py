"""Organisation B tries every endpoint against organisation A's job: nothing is seen or touched."""

from __future__ import annotations

from typing import Any

from tests.support.api import Api, json_of, payload


def _snapshot(api: Api, job_id: str) -> Any:
    return api.client.get(f"/jobs/{job_id}", headers=api.headers("a")).json


def test_another_organisation_can_neither_see_nor_touch_a_job(api: Api) -> None:
    job = api.job("a", jobId="a-private", sessionKey="a-session", payload=payload(secret="a-only"))
    job_id = job["id"]
    before_receipts = api.receipt_count()
    before_job = _snapshot(api, job_id)
    unknown = api.client.get("/jobs/definitely-unknown", headers=api.headers("b"))
    b = api.headers("b")

    # Reads: identical to an unknown job.
    for url in (
        f"/jobs/{job_id}",
        f"/jobs/{job_id}/events",
        f"/streams/jobs/{job_id}/receipts",
        f"/streams/jobs/{job_id}/events",
    ):
        response = api.client.get(url, headers=b)
        assert response.status_code == 404, url
        assert response.get_data() == unknown.get_data(), url

    # Mutations: 404 as well, and nothing written.
    for url, body in ((f"/jobs/{job_id}/commands", {"type": "abort"}), (f"/jobs/{job_id}/cancel", {})):
        response = api.client.post(url, json=body, headers=b)
        assert response.status_code == 404, url
        assert response.get_data() == unknown.get_data(), url

    # Lists exclude it, whatever the filters.
    for query in ({}, {"sessionKey": "a-session"}, {"agentId": "factory"}, {"status": "queued"}):
        listed = api.client.get("/jobs", query_string=query, headers=b).json
        assert listed == {"jobs": [], "nextCursor": None}, query
    assert api.client.get("/jobs", query_string={"organizationId": "org-a"}, headers=b).status_code == 403

    # Enqueue: the jobId is refused without detail; a steer on the same session key does not reach it.
    reuse = api.client.post(
        "/agents/factory/jobs", json={"jobId": job_id, "payload": payload(org="org-b")}, headers=b
    )
    assert reuse.status_code == 409
    assert "a-only" not in reuse.get_data(as_text=True) and "queued" not in reuse.get_data(as_text=True)
    steer = api.client.post(
        "/agents/factory/jobs",
        headers=b,
        json={
            "sessionKey": "a-session",
            "singletonMode": "steer",
            "payload": payload(org="org-b"),
        },
    )
    assert steer.status_code == 202
    assert json_of(steer)["job"]["id"] != job_id
    cancel_all = api.client.post(
        "/agents/factory/jobs",
        headers=b,
        json={
            "sessionKey": "a-session",
            "singletonMode": "cancel",
            "payload": payload(org="org-b"),
        },
    )
    assert cancel_all.status_code == 202
    # Posting on A's behalf is forbidden outright.
    assert (
        api.client.post("/agents/factory/jobs", json={"payload": payload(org="org-a")}, headers=b).status_code
        == 403
    )

    # A's job is exactly as it was. The only receipts written were B's own: two enqueues, and
    # B's cancel-singleton canceling B's first job on that session key.
    assert _snapshot(api, job_id) == before_job
    assert api.receipt_count() == before_receipts + 3
    b_first = json_of(api.client.get(f"/jobs/{json_of(steer)['job']['id']}", headers=b))
    assert b_first["job"]["status"] == "canceled"


def test_owner_and_system_can_see_it(api: Api) -> None:
    job = api.job("a")
    for who in ("a", "system"):
        assert api.client.get(f"/jobs/{job['id']}", headers=api.headers(who)).status_code == 200
        assert (
            api.client.get(f"/streams/jobs/{job['id']}/receipts", headers=api.headers(who)).status_code == 200
        )
    assert (
        api.client.post(
            f"/jobs/{job['id']}/commands", json={"type": "steer"}, headers=api.headers("system")
        ).status_code
        == 202
    )
    assert api.client.post(f"/jobs/{job['id']}/cancel", headers=api.headers("system")).status_code == 202
