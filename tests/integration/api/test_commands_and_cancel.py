"""POST /jobs/<jobId>/commands and POST /jobs/<jobId>/cancel."""

from __future__ import annotations

import pytest

from app.jobs.vocab import COMMAND_TYPES
from tests.support.api import Api, json_of, key
from tests.support.queue_ops import complete


@pytest.mark.parametrize("type_", COMMAND_TYPES)
def test_command_is_202_with_the_job(api: Api, type_: str) -> None:
    job = api.job()
    response = api.client.post(
        f"/jobs/{job['id']}/commands",
        headers=api.headers(),
        json={"type": type_, "payload": {"text": "hi"}, "reason": "because"},
    )
    assert response.status_code == 202
    got = json_of(response)["job"]
    (command,) = got["commands"]
    assert (command["type"], command["payload"], command["reason"]) == (type_, {"text": "hi"}, "because")
    assert command["consumed"] is False
    assert got["abortRequested"] is (type_ == "abort")
    assert got["route"]["queue"]


def test_command_type_must_be_known(api: Api) -> None:
    job = api.job()
    before = api.receipt_count()
    response = api.client.post(f"/jobs/{job['id']}/commands", headers=api.headers(), json={"type": "nudge"})
    assert response.status_code == 400
    assert json_of(response)["error"]["details"] == {"field": "type", "allowed": list(COMMAND_TYPES)}
    missing = api.client.post(f"/jobs/{job['id']}/commands", headers=api.headers(), json={})
    assert missing.status_code == 400
    assert json_of(missing)["error"]["details"]["field"] == "type"
    assert api.receipt_count() == before


def test_command_to_terminal_job_is_409(api: Api) -> None:
    job = api.job()
    api.queue.cancel(key(job))
    response = api.client.post(f"/jobs/{job['id']}/commands", headers=api.headers(), json={"type": "steer"})
    assert response.status_code == 409
    assert json_of(response)["error"]["code"] == "conflict"


def test_command_to_unknown_job_is_404(api: Api) -> None:
    response = api.client.post("/jobs/nope/commands", headers=api.headers(), json={"type": "steer"})
    assert response.status_code == 404


def test_cancel_queued_job_cancels_it(api: Api) -> None:
    job = api.job()
    response = api.client.post(
        f"/jobs/{job['id']}/cancel", headers=api.headers(), json={"reason": "no longer needed"}
    )
    assert response.status_code == 202
    got = json_of(response)["job"]
    assert got["status"] == "canceled"
    assert got["error"] == "no longer needed"


def test_cancel_without_a_body(api: Api) -> None:
    job = api.job()
    response = api.client.post(f"/jobs/{job['id']}/cancel", headers=api.headers())
    assert response.status_code == 202
    assert json_of(response)["job"]["status"] == "canceled"


def test_cancel_running_job_sends_abort(api: Api) -> None:
    job = api.job()
    api.lease_and_start(key(job))
    response = api.client.post(f"/jobs/{job['id']}/cancel", headers=api.headers(), json={"reason": "stop"})
    assert response.status_code == 202
    got = json_of(response)["job"]
    assert got["status"] == "running"
    assert got["abortRequested"] is True
    assert [(c["type"], c["reason"]) for c in got["commands"]] == [("abort", "stop")]


def test_cancel_terminal_job_is_409(api: Api) -> None:
    job = api.job()
    attempt = api.lease_and_start(key(job))
    complete(api.queue, key(job), "worker-1", attempt, None)
    before = api.receipt_count()
    response = api.client.post(f"/jobs/{job['id']}/cancel", headers=api.headers())
    assert response.status_code == 409
    assert api.receipt_count() == before


def test_cancel_rejects_unknown_fields(sqlite_api: Api) -> None:
    job = sqlite_api.job()
    response = sqlite_api.client.post(
        f"/jobs/{job['id']}/cancel", headers=sqlite_api.headers(), json={"why": "x"}
    )
    assert response.status_code == 400
    assert json_of(response)["error"]["details"] == {"field": "why", "allowed": ["reason"]}
