"""The objectives API: shapes, auth and tenancy, bad input (400, nothing written), cancel, SSE, streams."""

from __future__ import annotations

from typing import Any

import pytest

from app.factory.vocab import MAX_PLAN_TASKS
from app.jobs.ids import qualify
from app.storage import tokens
from receipt.client import apply_objective_event
from tests.factory_support import DIAMOND, HOLD, drain, plan
from tests.support.api import ORG_A, ORG_B, Api, auth_context, json_of

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone


def body(deps: dict[str, list[str]] | None = None, **extra: Any) -> dict[str, Any]:
    return {"title": "Ship it", "goal": "Build and check", "plan": plan(deps or DIAMOND), **extra}


def launch(api: Api, who: str = "a", **extra: Any) -> dict[str, Any]:
    r = api.client.post("/objectives", json=body(**extra), headers=api.headers(who))
    assert r.status_code == 202, json_of(r)
    data: dict[str, Any] = json_of(r)
    return data


def test_launch_answers_202_with_the_objective_and_where_to_follow_it(api: Api) -> None:
    data = launch(api, objectiveId="obj-1")
    obj = data["objective"]
    assert set(obj) == {
        "id",
        "organizationId",
        "stream",
        "title",
        "goal",
        "status",
        "phase",
        "failurePolicy",
        "tasks",
        "audit",
        "createdAt",
        "updatedAt",
    }
    assert (obj["id"], obj["organizationId"], obj["stream"]) == ("obj-1", ORG_A, f"objectives/{ORG_A}/obj-1")
    assert (obj["status"], obj["phase"], obj["failurePolicy"]) == (
        "active",
        1,
        "failFast",
    )
    assert [t["id"] for t in obj["tasks"]] == ["A", "B", "C", "D"]
    assert set(obj["tasks"][0]) == {
        "id",
        "agentId",
        "kind",
        "dependsOn",
        "status",
        "jobId",
        "jobStream",
        "attempt",
        "result",
        "error",
        "phase",
    }
    assert data["async"] == {
        "objectiveId": "obj-1",
        "stream": f"objectives/{ORG_A}/obj-1",
        "eventsUrl": "/objectives/obj-1/events",
    }
    # The same objectiveId returns the existing objective unchanged; in another organisation it is
    # that organisation's own objective.
    count = api.receipt_count()
    again = launch(api, objectiveId="obj-1", title="Other title")
    assert again["objective"]["title"] == "Ship it" and api.receipt_count() == count
    theirs = launch(api, "b", objectiveId="obj-1", title="Theirs")["objective"]
    assert (theirs["id"], theirs["organizationId"], theirs["stream"], theirs["title"]) == (
        "obj-1",
        ORG_B,
        f"objectives/{ORG_B}/obj-1",
        "Theirs",
    )
    mine = json_of(api.client.get("/objectives/obj-1", headers=api.headers()))["objective"]
    assert (mine["organizationId"], mine["title"]) == (ORG_A, "Ship it")


def test_an_objective_runs_to_completion_and_get_shows_every_task(api: Api) -> None:
    oid = launch(api)["objective"]["id"]
    drain(api.queue)
    r = api.client.get(f"/objectives/{oid}", headers=api.headers())
    assert r.status_code == 200
    obj = json_of(r)["objective"]
    assert obj["status"] == "completed"
    assert {t["status"] for t in obj["tasks"]} == {"completed"}
    d = obj["tasks"][3]
    assert d["jobId"] == f"{oid}:p1:D" and d["jobStream"] == f"jobs/{ORG_A}/{oid}:p1:D"
    assert d["attempt"] == 1 and set(d["result"]["inputs"]) == {"B", "C"}
    assert obj["audit"]["tasksByStatus"] == {"completed": 4}


def test_another_organisation_sees_nothing(api: Api) -> None:
    launched = launch(api)["objective"]
    oid, stream = launched["id"], launched["stream"]
    unknown = api.client.get("/objectives/nope", headers=api.headers("b"))
    for path in (f"/objectives/{oid}", f"/streams/{stream}/receipts", f"/objectives/{oid}/events"):
        r = api.client.get(path, headers=api.headers("b"))
        assert r.status_code == 404 and json_of(r) == json_of(unknown), path
    assert api.client.post(f"/objectives/{oid}/cancel", json={}, headers=api.headers("b")).status_code == 404
    assert json_of(api.client.get("/objectives", headers=api.headers("b")))["objectives"] == []
    mine = api.client.get(f"/streams/{stream}/receipts", headers=api.headers("a"))
    assert mine.status_code == 200
    assert [r["type"] for r in json_of(mine)["receipts"]][:2] == [
        "objective.launched",
        "objective.control_requested",
    ]
    # A system token acts in its own organisation unless it names another.
    system = api.headers("system")
    assert api.client.get(f"/objectives/{oid}", headers=system).status_code == 404
    named = api.client.get(f"/objectives/{oid}?organizationId={ORG_A}", headers=system)
    assert named.status_code == 200 and json_of(named)["objective"]["organizationId"] == ORG_A


def test_list_pages_newest_first_and_filters_by_status(api: Api) -> None:
    ids = [launch(api)["objective"]["id"] for _ in range(3)]
    r = api.client.get("/objectives?limit=2", headers=api.headers())
    page = json_of(r)
    assert [o["id"] for o in page["objectives"]] == ids[::-1][:2]
    r2 = api.client.get(f"/objectives?limit=2&cursor={page['nextCursor']}", headers=api.headers())
    assert [o["id"] for o in json_of(r2)["objectives"]] == [ids[0]]
    assert json_of(r2)["nextCursor"] is None
    done = json_of(api.client.get("/objectives?status=completed", headers=api.headers()))
    assert done["objectives"] == []
    bad = api.client.get("/objectives?status=running", headers=api.headers())
    assert bad.status_code == 400 and json_of(bad)["error"]["details"]["allowed"] == [
        "active",
        "completed",
        "failed",
        "canceled",
    ]


def test_cancel_answers_202_then_409_once_terminal(api: Api) -> None:
    oid = launch(api)["objective"]["id"]
    r = api.client.post(f"/objectives/{oid}/cancel", json={"reason": "stop"}, headers=api.headers())
    assert r.status_code == 202
    drain(api.queue)
    obj = json_of(api.client.get(f"/objectives/{oid}", headers=api.headers()))["objective"]
    assert obj["status"] == "canceled"
    assert all(t["status"] in ("canceled", "skipped") for t in obj["tasks"])
    r = api.client.post(f"/objectives/{oid}/cancel", json={}, headers=api.headers())
    assert r.status_code == 409 and json_of(r)["error"]["code"] == "conflict"


def _tasks(n: int) -> list[dict[str, Any]]:
    return [{"id": f"t{i}", "agentId": "test-echo"} for i in range(n)]


BAD_BODIES: list[tuple[str, dict[str, Any], str, str]] = [
    (
        "cycle",
        {
            "plan": {
                "tasks": [
                    {"id": "a", "dependsOn": ["c"]},
                    {"id": "b", "dependsOn": ["a"]},
                    {"id": "c", "dependsOn": ["b"]},
                ]
            }
        },
        "plan.tasks",
        "cycle: a -> c -> b -> a",
    ),
    (
        "self cycle",
        {"plan": {"tasks": [{"id": "a", "dependsOn": ["a"]}]}},
        "plan.tasks[0].dependsOn",
        "a -> a",
    ),
    (
        "unknown dep",
        {"plan": {"tasks": [{"id": "a", "dependsOn": ["zz"]}]}},
        "plan.tasks[0].dependsOn",
        "'zz'",
    ),
    ("duplicate", {"plan": {"tasks": [{"id": "a"}, {"id": "a"}]}}, "plan.tasks[1].id", "duplicate task id"),
    ("empty", {"plan": {"tasks": []}}, "plan.tasks", "empty"),
    ("too many", {"plan": {"tasks": _tasks(MAX_PLAN_TASKS + 1)}}, "plan.tasks", "at most 1000"),
    (
        "watchdog",
        {"plan": {"tasks": [{"id": "a", "payload": {"kind": "factory.objective.watchdog"}}]}},
        "plan.tasks[0].payload.kind",
        "cannot be a task",
    ),
    (
        "control",
        {"plan": {"tasks": [{"id": "a", "payload": {"kind": "factory.objective.control"}}]}},
        "plan.tasks[0].payload.kind",
        "cannot be a task",
    ),
    (
        "audit",
        {"plan": {"tasks": [{"id": "a", "payload": {"kind": "factory.objective.audit"}}]}},
        "plan.tasks[0].payload.kind",
        "cannot be a task",
    ),
    (
        "bad kind",
        {"plan": {"tasks": [{"id": "a", "payload": {"kind": "nope"}}]}},
        "plan.tasks[0].payload.kind",
        "not a payload kind",
    ),
    (
        "bad maxAttempts",
        {"plan": {"tasks": [{"id": "a", "maxAttempts": 1.5}]}},
        "plan.tasks[0].maxAttempts",
        "",
    ),
    (
        "stamped field",
        {"plan": {"tasks": [{"id": "a", "payload": {"objectiveId": "x"}}]}},
        "plan.tasks[0].payload.objectiveId",
        "set by the objective",
    ),
    ("bad task id", {"plan": {"tasks": [{"id": "a:b"}]}}, "plan.tasks[0].id", ""),
    ("bad policy", {"failurePolicy": "sometimes"}, "failurePolicy", ""),
    (
        "bad path",
        {"plan": {"tasks": [{"id": "a", "executionPath": "moon"}]}},
        "plan.tasks[0].executionPath",
        "",
    ),
    ("no plan", {"plan": None}, "plan", ""),
    ("other org", {"authContext": auth_context(ORG_B)}, "", "organisation"),
]


@pytest.mark.parametrize("case", BAD_BODIES, ids=[c[0] for c in BAD_BODIES])
def test_bad_input_is_a_400_naming_the_problem_and_writes_nothing(
    sqlite_api: Api, case: tuple[str, dict[str, Any], str, str]
) -> None:
    name, override, field, text = case
    count = sqlite_api.receipt_count()
    r = sqlite_api.client.post("/objectives", json={**body(), **override}, headers=sqlite_api.headers())
    error = json_of(r)["error"]
    if name == "other org":
        assert r.status_code == 403
    else:
        assert r.status_code == 400, json_of(r)
        assert error["details"]["field"] == field, error
    assert text in error["message"], error
    assert sqlite_api.receipt_count() == count


def test_without_an_auth_context_the_objective_belongs_to_the_tokens_own_organisation(
    sqlite_api: Api,
) -> None:
    # A rule the OpenAPI document can state: no token-dependent "authContext is required".
    r = sqlite_api.client.post("/objectives", json=body(), headers=sqlite_api.headers("system"))
    assert r.status_code == 202
    r = sqlite_api.client.post(
        "/objectives", json=body(authContext=auth_context(ORG_A)), headers=sqlite_api.headers("system")
    )
    assert r.status_code == 202


def _shown(api: Api, oid: str) -> dict[str, Any]:
    """GET's objective without the ledger (the event stream does not carry it)."""
    obj: dict[str, Any] = json_of(api.client.get(f"/objectives/{oid}", headers=api.headers()))["objective"]
    del obj["ledger"]
    return obj


def test_events_send_a_snapshot_then_one_small_delta_per_receipt(api: Api, open_events: Any) -> None:
    oid = launch(api)["objective"]["id"]
    reader = open_events(api.client, f"/objectives/{oid}/events", api.headers())
    first = reader.next_event()
    assert first.event == "objective"
    assert first.data == _shown(api, oid)  # the snapshot is GET's shape, overlay included
    head = first.id
    drain(api.queue)  # the whole diamond runs while the stream is open
    frames = reader.rest()
    assert reader.ended  # ended once the objective ended and its audit came in
    deltas = [f for f in frames if f.event == "delta"]
    assert [f.id for f in deltas] == list(range(head + 1, head + 1 + len(deltas)))
    assert all(f.data["seq"] == f.id and f.data["type"].startswith("objective.") for f in deltas)
    # Small: a delta names only the tasks that changed (never all four on every receipt).
    assert max(len(f.data["tasks"]) for f in deltas) < 4
    assert any(f.data.get("status") == "completed" for f in deltas)
    assert "status" not in deltas[0].data or deltas[0].data["status"] != "active"
    # Applying every event to the snapshot gives exactly what GET shows at the end.
    state: dict[str, Any] | None = None
    for frame in [first, *frames]:
        state = apply_objective_event(state, frame.event, frame.data)
    assert state == _shown(api, oid)


def test_events_resume_with_a_fresh_snapshot_and_end_when_caught_up(api: Api, open_events: Any) -> None:
    oid = launch(api)["objective"]["id"]
    drain(api.queue)
    final = _shown(api, oid)
    resumed = open_events(api.client, f"/objectives/{oid}/events", api.headers(**{"Last-Event-ID": "3"}))
    frames = resumed.rest()
    assert [f.event for f in frames] == ["objective"]
    assert frames[0].data == final
    head = frames[0].id
    assert head > 3
    caught_up = open_events(
        api.client, f"/objectives/{oid}/events", api.headers(**{"Last-Event-ID": str(head)})
    )
    assert caught_up.rest() == []


def test_events_show_a_task_whose_job_starts_running(api: Api, open_events: Any) -> None:
    oid = launch(api, plan=plan({"A": [], "B": []}, {"A": HOLD, "B": HOLD}))["objective"]["id"]
    drain(api.queue, skip_agents=(HOLD,))  # control queues A and B; nothing runs them
    reader = open_events(api.client, f"/objectives/{oid}/events", api.headers())
    snapshot = reader.next_event()
    assert [t["status"] for t in snapshot.data["tasks"]] == ["queued", "queued"]
    job_a = qualify(ORG_A, snapshot.data["tasks"][0]["jobId"])
    api.lease_and_start(job_a)  # no objective receipt: only the job's stream moves
    frame = reader.next_event()
    assert frame.event == "task" and frame.id is None  # no id: the resume point stays put
    assert [(t["id"], t["status"], t["attempt"]) for t in frame.data["tasks"]] == [("A", "running", 1)]
    state = apply_objective_event(None, "objective", snapshot.data)
    state = apply_objective_event(state, frame.event, frame.data)
    assert state == _shown(api, oid)


def test_a_revoked_tokens_objective_stream_ends_within_one_poll(api: Api, open_events: Any) -> None:
    oid = launch(api)["objective"]["id"]
    reader = open_events(api.client, f"/objectives/{oid}/events", api.headers())
    assert reader.next_event().event == "objective"
    assert tokens.revoke(api.engine, api.secrets["a"])
    frames = []
    while (frame := reader.next_frame()) is not None:
        frames.append(frame)
        assert len(frames) < 50
    assert frames[-1].comment == "credentials revoked or expired"


def test_openapi_documents_the_objective_routes(sqlite_api: Api) -> None:
    doc = json_of(sqlite_api.client.get("/openapi.json", headers=sqlite_api.headers()))
    paths = doc["paths"]
    assert set(paths["/objectives"]) == {"get", "post"}
    assert "get" in paths["/objectives/{objectiveId}"]
    assert "post" in paths["/objectives/{objectiveId}/cancel"]
    assert (
        "text/event-stream" in paths["/objectives/{objectiveId}/events"]["get"]["responses"]["200"]["content"]
    )
