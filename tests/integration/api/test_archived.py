"""Archived jobs and objectives over HTTP: 410 with the tombstone's summary, ids that stay taken,
nothing written, and nothing another organisation can learn."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from app.retention import archive
from app.retention.policy import Policy
from app.retention.sink import DirectorySink
from app.storage.db import db_now
from tests.support.api import ORG_A, Api, json_of, payload
from tests.support.queue_ops import complete, lease

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone

LONG = 600_000
PLAN = {"tasks": [{"id": "t1", "agentId": "test-echo", "payload": {"kind": "factory.task.run"}}]}


def _archive_all(api: Api, tmp_path: Path) -> archive.Totals:
    return archive.run_pass(
        api.engine,
        DirectorySink(tmp_path / "archive"),
        Policy(days=30),
        page_size=50,
        clock=lambda conn: db_now(conn) + timedelta(days=31),
    )


def _finished(api: Api, job_id: str) -> dict[str, Any]:
    job = api.job("a", jobId=job_id)
    key = f"{ORG_A}/{job_id}"
    lease(api.queue, key, "w1", LONG)
    complete(api.queue, key, "w1", 1, {"done": True})
    return job


def _is_archived_answer(response: Any, job_id: str, status: str = "completed") -> dict[str, Any]:
    assert response.status_code == 410, response.get_data(as_text=True)
    error = json_of(response)["error"]
    assert error["code"] == "archived"
    details: dict[str, Any] = error["details"]
    assert (details["id"], details["status"], details["archived"]) == (job_id, status, True)
    assert details["organizationId"] == ORG_A
    assert details["archive"]["segment"] in error["message"]
    return details


def test_an_archived_job_answers_410_with_its_summary(api: Api, tmp_path: Path) -> None:
    _finished(api, "old-job")
    assert _archive_all(api, tmp_path).jobs == 1
    details = _is_archived_answer(api.client.get("/jobs/old-job", headers=api.headers("a")), "old-job")
    assert details["agentId"] == "factory" and details["kind"] == "factory.run"
    assert details["archive"]["receiptCount"] == 3 and len(details["archive"]["finalHash"]) == 64
    for method, url, body in (
        ("get", "/jobs/old-job/events", None),
        ("post", "/jobs/old-job/cancel", {}),
        ("post", "/jobs/old-job/commands", {"type": "abort"}),
    ):
        response = getattr(api.client, method)(url, json=body, headers=api.headers("a"))
        _is_archived_answer(response, "old-job")
    # Its receipts are in the archive, not behind the stream routes: they answer the same 410 (the
    # summary says which segment), and another organisation the 404 of a stream that never was.
    stream = details["archive"]["stream"]
    for url in (f"/streams/{stream}/receipts", f"/streams/{stream}/events"):
        _is_archived_answer(api.client.get(url, headers=api.headers("a")), "old-job")
        hidden = api.client.get(url, headers=api.headers("b"))
        never = api.client.get(url.replace("old-job", "never-was"), headers=api.headers("b"))
        assert hidden.status_code == 404 and hidden.get_data() == never.get_data(), url
    listed = json_of(api.client.get("/jobs", headers=api.headers("a")))
    assert all(j["id"] != "old-job" for j in listed["jobs"])
    # A system token naming the organisation reads it too.
    named = api.client.get(
        "/jobs/old-job", query_string={"organizationId": ORG_A}, headers=api.headers("system")
    )
    _is_archived_answer(named, "old-job")


def _item(job_id: str) -> dict[str, Any]:
    return {"agentId": "factory", "jobId": job_id, "payload": payload()}


def test_reposting_an_archived_id_creates_nothing(api: Api, tmp_path: Path) -> None:
    _finished(api, "again")
    _archive_all(api, tmp_path)
    before = api.receipt_count()
    _is_archived_answer(api.enqueue("a", jobId="again"), "again")
    batch = api.client.post(
        "/jobs:batch",
        json={
            "items": [
                {"agentId": "factory", "jobId": "again", "payload": payload()},
                {"agentId": "factory", "jobId": "new-one", "payload": payload()},
            ]
        },
        headers=api.headers("a"),
    )
    assert batch.status_code == 202, batch.json
    first, second = json_of(batch)["jobs"]
    assert first["created"] is False and "job" not in first
    assert first["archived"]["id"] == "again" and first["archived"]["archived"] is True
    assert second["created"] is True and second["job"]["id"] == "new-one"
    assert api.receipt_count() == before + 1  # the new job's job.enqueued only


def test_another_organisation_learns_nothing_of_an_archived_job(api: Api, tmp_path: Path) -> None:
    _finished(api, "a-secret")
    _archive_all(api, tmp_path)
    b = api.headers("b")
    unknown = api.client.get("/jobs/never-was", headers=b)
    gone = api.client.get("/jobs/a-secret", headers=b)
    assert gone.status_code == 404 and gone.get_data() == unknown.get_data()
    # Posting the id in B makes B's own job.
    assert api.enqueue("b", jobId="a-secret").status_code == 202


def test_an_archived_objective_answers_410(api: Api, tmp_path: Path) -> None:
    from tests.factory_support import drain

    objective = api.objective(
        "a",
        objectiveId="obj-old",
        plan=PLAN,
    )
    drain(api.queue)
    read = api.client.get("/objectives/obj-old", headers=api.headers("a"))
    assert json_of(read)["objective"]["status"] == "completed"
    totals = _archive_all(api, tmp_path)
    assert totals.objectives == 1
    response = api.client.get("/objectives/obj-old", headers=api.headers("a"))
    details = _is_archived_answer(response, objective["id"])
    assert details["title"] == objective["title"]
    stream = details["archive"]["stream"]
    assert stream.startswith("objectives/")
    _is_archived_answer(api.client.get(f"/streams/{stream}/receipts", headers=api.headers("a")), "obj-old")
    assert api.client.get(f"/streams/{stream}/receipts", headers=api.headers("b")).status_code == 404
    relaunch = api.client.post(
        "/objectives",
        json={
            "objectiveId": "obj-old",
            "title": "x",
            "goal": "y",
            "plan": {
                "tasks": [{"id": "t1", "agentId": "test-echo", "payload": {"kind": "factory.task.run"}}]
            },
        },
        headers=api.headers("a"),
    )
    _is_archived_answer(relaunch, "obj-old")
    assert api.client.get("/objectives/obj-old", headers=api.headers("b")).status_code == 404
