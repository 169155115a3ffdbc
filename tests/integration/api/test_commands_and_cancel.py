"""POST /jobs/<jobId>/commands and POST /jobs/<jobId>/cancel."""

from __future__ import annotations

from typing import Any

import pytest

from app.jobs.vocab import COMMAND_LANES, COMMAND_TYPES
from app.storage import store
from tests.support.api import Api, json_of, key
from tests.support.queue_ops import complete

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone


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
    # A steer or follow_up is on the lane its type names unless it names one; an abort on none.
    assert command.get("lane") == (None if type_ == "abort" else type_)
    assert got["abortRequested"] is (type_ == "abort")
    assert got["route"]["queue"]


def test_a_command_is_sent_on_the_lane_it_names(api: Api, projection_equals_fold: Any) -> None:
    """Spec: commands are typed steer, follow_up or abort; the queue-command lanes are steer and
    follow_up. A steer may go on the follow_up lane (taken after the job's current turn)."""
    job = api.job()
    response = api.client.post(
        f"/jobs/{job['id']}/commands", headers=api.headers(), json={"type": "steer", "lane": "follow_up"}
    )
    assert response.status_code == 202
    (command,) = json_of(response)["job"]["commands"]
    assert (command["type"], command["lane"]) == ("steer", "follow_up")
    with api.engine.connect() as conn:
        receipt = store.read_stream(conn, job["stream"])[-1]
    assert receipt.type == "queue.command"
    assert (receipt.body["type"], receipt.body["lane"]) == ("steer", "follow_up")
    projection_equals_fold(api.engine, key(job))


@pytest.mark.parametrize(
    ("body", "allowed"),
    [
        ({"type": "follow_up", "lane": "collect"}, list(COMMAND_LANES)),
        ({"type": "steer", "lane": "chat"}, list(COMMAND_LANES)),
        ({"type": "abort", "lane": "steer"}, None),
    ],
    ids=["job lane collect", "job lane chat", "abort with a lane"],
)
def test_a_command_lane_is_steer_or_follow_up_and_an_abort_takes_none(
    api: Api, body: dict[str, Any], allowed: list[str] | None
) -> None:
    job = api.job()
    before = api.receipt_count()
    response = api.client.post(f"/jobs/{job['id']}/commands", headers=api.headers(), json=body)
    assert response.status_code == 400
    details = json_of(response)["error"]["details"]
    assert details["field"] == "lane" and details.get("allowed") == allowed
    assert api.receipt_count() == before


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
