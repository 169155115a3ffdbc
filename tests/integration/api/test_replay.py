"""POST /jobs/{jobId}/replay: a terminal job re-run as a new job, linked both ways by receipts,
in its organisation, idempotent under a retried request; an objective's job goes through its replan."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.jobs.replay import derived_id
from app.storage import store
from tests.support.api import ORG_A, ORG_B, Api, json_of, key, payload


def _failed(api: Api, **body: Any) -> dict[str, Any]:
    job = api.job(**body)
    assert (
        api.queue.fail(key(job), None, None, "command exited with 1", retryable=False).job.status == "failed"
    )
    return job


def _replay(api: Api, job_id: str, who: str = "a", **body: Any) -> Any:
    return api.client.post(f"/jobs/{job_id}/replay", json=body, headers=api.headers(who))


def _stream(api: Api, stream: str) -> list[tuple[str, Mapping[str, Any]]]:
    with api.engine.connect() as conn:
        return [(r.type, r.body) for r in store.read_stream(conn, stream)]


def test_a_failed_job_is_replayed_as_a_new_job_linked_both_ways(api: Api) -> None:
    source = _failed(api, tags={"customer": "acme"}, lane="chat", maxAttempts=3)
    response = _replay(api, source["id"])
    assert response.status_code == 202, response.json
    body = json_of(response)
    new = body["job"]
    assert body["created"] is True and body["replayOf"] == source["id"]
    assert new["id"] == derived_id(key(source), "1")
    assert new["status"] == "queued" and new["organizationId"] == ORG_A
    assert (new["payload"], new["agentId"], new["lane"], new["maxAttempts"], new["tags"]) == (
        source["payload"],
        source["agentId"],
        "chat",
        3,
        {"customer": "acme"},
    )
    assert new["replayOf"] == key(source)
    assert response.headers["Location"] == f"/jobs/{new['id']}"
    [(kind, enqueued)] = _stream(api, new["stream"])
    assert kind == "job.enqueued" and enqueued["replayOf"] == key(source)
    assert _stream(api, source["stream"])[-1] == ("job.replayed", {"replayedAs": key(new)})
    again = json_of(api.client.get(f"/jobs/{source['id']}", headers=api.headers()))["job"]
    assert again["status"] == "failed" and again["replayedAs"] == [key(new)]
    assert api.woken and api.woken[-1].id == key(new)  # delivered like any new job


def test_a_retried_request_returns_the_same_replay_and_writes_nothing(api: Api) -> None:
    source = _failed(api)
    first = json_of(_replay(api, source["id"], replayKey="k1"))
    count = api.receipt_count()
    retried = _replay(api, source["id"], replayKey="k1")
    assert retried.status_code == 202
    assert json_of(retried)["created"] is False
    assert json_of(retried)["job"]["id"] == first["job"]["id"]
    assert api.receipt_count() == count
    second = json_of(_replay(api, source["id"], replayKey="k2"))
    assert second["created"] is True and second["job"]["id"] != first["job"]["id"]
    shown = json_of(api.client.get(f"/jobs/{source['id']}", headers=api.headers()))["job"]
    assert shown["replayedAs"] == [key(first["job"]), key(second["job"])]


def test_a_chosen_id_and_an_edited_payload(api: Api) -> None:
    source = _failed(api)
    edited = payload(note="fixed input")
    response = _replay(api, source["id"], jobId="my-rerun", payload=edited, tags={"try": "2"})
    assert response.status_code == 202, response.json
    new = json_of(response)["job"]
    assert new["id"] == "my-rerun" and new["payload"]["note"] == "fixed input" and new["tags"] == {"try": "2"}
    # The id names that replay from now on; another job's id is a conflict, never a second job.
    assert json_of(_replay(api, source["id"], jobId="my-rerun"))["created"] is False
    other = api.job(jobId="taken")
    count = api.receipt_count()
    conflict = _replay(api, source["id"], jobId=other["id"])
    assert conflict.status_code == 409, conflict.json
    assert api.receipt_count() == count


def test_a_replay_stays_in_its_organisation(api: Api) -> None:
    source = _failed(api)
    count = api.receipt_count()
    # Another organisation cannot see the job: the unknown id's 404.
    assert _replay(api, source["id"], "b").status_code == 404
    # An edited payload may not move it to another organisation.
    moved = _replay(api, source["id"], payload=payload(org=ORG_B))
    assert moved.status_code == 403, moved.json
    assert "payload.authContext.organizationId" in json_of(moved)["error"]["message"]
    # A system token names the organisation it acts in; the replay is that organisation's.
    system = api.client.post(
        f"/jobs/{source['id']}/replay",
        query_string={"organizationId": ORG_A},
        json={},
        headers=api.headers("system"),
    )
    assert system.status_code == 202, system.json
    assert json_of(system)["job"]["organizationId"] == ORG_A
    assert api.receipt_count() == count + 2  # the system's replay: its job.enqueued and job.replayed


def test_only_an_ended_job_is_replayed(api: Api) -> None:
    queued = api.job()
    count = api.receipt_count()
    response = _replay(api, queued["id"])
    assert response.status_code == 409
    assert "only a completed, failed or canceled job" in json_of(response)["error"]["message"]
    assert api.receipt_count() == count


def test_an_objectives_job_is_replayed_through_its_replan_never_around_it(api: Api) -> None:
    objective = api.objective()
    listed = api.client.get(
        "/jobs", query_string={"kind": "factory.objective.control"}, headers=api.headers()
    )
    [control] = json_of(listed)["jobs"]
    api.queue.fail(key(control), None, None, "boom", retryable=False)
    count = api.receipt_count()
    response = _replay(api, control["id"])
    assert response.status_code == 409
    message = json_of(response)["error"]["message"]
    assert f"POST /objectives/{objective['id']}/plan" in message
    assert api.receipt_count() == count
    # Nor may an edited payload make a replay join an objective.
    source = _failed(api)
    joined = _replay(api, source["id"], payload=payload(objectiveId=objective["id"]))
    assert joined.status_code == 403
    assert "payload.objectiveId" in json_of(joined)["error"]["message"]


def test_bad_replay_bodies_are_a_400_naming_the_field(api: Api) -> None:
    source = _failed(api)
    count = api.receipt_count()
    for body, field in (
        ({"replayKey": "bad key"}, "replayKey"),
        ({"jobId": "x", "replayKey": "k"}, "jobId"),
        ({"jobId": "no spaces"}, "jobId"),
        ({"payload": {"kind": "nope"}}, "payload.kind"),
        ({"tags": {"k": ""}}, "tags.k"),
        ({"surprise": 1}, "surprise"),
    ):
        response = _replay(api, source["id"], **body)
        assert response.status_code == 400, (body, response.json)
        assert json_of(response)["error"]["details"]["field"] == field, (body, response.json)
    assert api.receipt_count() == count


def test_a_replay_after_heads_read_earlier_re_reads_a_source_that_moved(api: Api) -> None:
    """A bulk replay appends after the heads its page read; a source another request replayed in
    between makes that attempt conflict, and the re-run appends after the new head."""
    from app.jobs.replay import replay_request
    from app.storage import projection

    source = _failed(api)
    with api.engine.connect() as conn:
        stale = projection.load(conn, key(source))
    assert stale is not None
    assert _replay(api, source["id"], replayKey="meanwhile").status_code == 202  # the source moves on
    req = replay_request(stale.job, replay_key="bulk")
    [result] = api.queue.replay_many([(key(source), req)], known={key(source): stale})
    assert not isinstance(result, Exception) and result.created
    types = [t for t, _ in _stream(api, source["stream"])]
    assert types == ["job.enqueued", "job.failed", "job.replayed", "job.replayed"]
    shown = json_of(api.client.get(f"/jobs/{source['id']}", headers=api.headers()))["job"]
    assert len(shown["replayedAs"]) == 2
