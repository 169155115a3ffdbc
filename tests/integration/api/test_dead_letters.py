"""GET /dead-letters: jobs failed for good (not retryable, or out of attempts) per agent and kind,
with counts by error; replayable from there (one by one, or by filter)."""

from __future__ import annotations

from typing import Any

from tests.support.api import ORG_A, ORG_B, WORKER, Api, json_of, key, payload
from tests.support.queue_ops import lease


def _view(api: Api, who: str = "a", **query: str) -> dict[str, Any]:
    response = api.client.get("/dead-letters", query_string=query, headers=api.headers(who))
    assert response.status_code == 200, response.json
    body: dict[str, Any] = json_of(response)
    return body


def test_dead_letters_per_agent_and_kind_with_counts_by_error(api: Api) -> None:
    for error in ("command exited with 1", "command exited with 1", "timeout"):
        job = api.job()
        api.queue.fail(key(job), None, None, error, retryable=False)
    task = api.job(agent="test-echo", payload=payload("factory.task.run"))
    api.queue.fail(key(task), None, None, {"message": "boom"}, retryable=False)
    # Out of attempts: a retryable failure on the last attempt is a dead letter too.
    last = api.job(maxAttempts=1)
    attempt = lease(api.queue, key(last), WORKER, 60_000).job.attempt
    assert api.queue.fail(key(last), WORKER, attempt, "flaky", retryable=True).job.status == "failed"
    # A retryable failure with attempts left is queued again: not a dead letter.
    retried = api.job(maxAttempts=3)
    attempt = lease(api.queue, key(retried), WORKER, 60_000).job.attempt
    assert api.queue.fail(key(retried), WORKER, attempt, "flaky", retryable=True).job.status == "queued"
    api.job("b", payload=payload(org=ORG_B))
    view = _view(api)
    assert view["total"] == 5
    factory, echo = view["groups"]
    assert (factory["agentId"], factory["kind"], factory["count"]) == ("factory", "factory.run", 4)
    assert factory["errors"][0] == {"error": "command exited with 1", "count": 2}
    assert {e["error"] for e in factory["errors"]} == {"command exited with 1", "timeout", "flaky"}
    assert echo == {
        "agentId": "test-echo",
        "kind": "factory.task.run",
        "count": 1,
        "errors": [{"error": "boom", "count": 1}],
    }
    assert _view(api, kind="factory.task.run")["total"] == 1
    assert _view(api, errorPrefix="command")["total"] == 2
    assert _view(api, "b")["total"] == 0  # another organisation's view is its own


def test_dead_letters_are_replayed_from_the_view_by_filter(api: Api) -> None:
    made = []
    for _ in range(3):
        job = api.job()
        api.queue.fail(key(job), None, None, "command exited with 1", retryable=False)
        made.append(job)
    flt = {"status": "failed", "agentId": "factory", "kind": "factory.run", "errorPrefix": "command exited"}
    response = api.client.post(
        "/jobs:bulk",
        json={"action": "replay", "filter": flt, "idempotencyKey": "dl-1"},
        headers=api.headers(),
    )
    assert json_of(response)["affected"] == 3
    # Still dead letters (a replay is a new job), each now replayed once.
    assert _view(api)["total"] == 3
    for job in made:
        shown = json_of(api.client.get(f"/jobs/{job['id']}", headers=api.headers()))["job"]
        assert len(shown["replayedAs"]) == 1


def test_a_bad_filter_is_a_400_and_a_system_token_names_the_organisation(api: Api) -> None:
    response = api.client.get("/dead-letters", query_string={"kind": "nope"}, headers=api.headers())
    assert response.status_code == 400
    assert json_of(response)["error"]["details"]["field"] == "kind"
    status = api.client.get("/dead-letters", query_string={"status": "queued"}, headers=api.headers())
    assert status.status_code == 400  # the view's status is its own
    job = api.job()
    api.queue.fail(key(job), None, None, "x", retryable=False)
    system = api.client.get(
        "/dead-letters", query_string={"organizationId": ORG_A}, headers=api.headers("system")
    )
    assert json_of(system)["total"] == 1
    # Without organizationId a system token is refused: it names the organisation it acts in.
    unnamed = api.client.get("/dead-letters", headers=api.headers("system"))
    assert unnamed.status_code == 403
    assert json_of(unnamed)["error"]["details"]["field"] == "organizationId"
