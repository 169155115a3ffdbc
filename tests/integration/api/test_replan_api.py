"""``POST /objectives/<id>/plan``: phase n+1 over HTTP — 202, 400 naming the field, 404, 409."""

from __future__ import annotations

from typing import Any

import pytest

from tests.factory_support import drain, plan
from tests.support.api import ORG_A, Api, json_of

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone


def launch(api: Api) -> str:
    body = {"title": "t", "goal": "g", "plan": plan({"A": [], "B": ["A"]})}
    r = api.client.post("/objectives", json=body, headers=api.headers())
    assert r.status_code == 202, r.json
    oid: str = r.json["async"]["objectiveId"]  # type: ignore[index]
    return oid


def _receipts(api: Api, oid: str) -> Any:
    url = f"/streams/objectives/{ORG_A}/{oid}/receipts"
    return json_of(api.client.get(url, headers=api.headers()))["receipts"]


def replan(api: Api, oid: str, body: Any, who: str = "a") -> Any:
    return api.client.post(f"/objectives/{oid}/plan", json=body, headers=api.headers(who))


def test_replan_answers_202_and_get_shows_every_phase(api: Api) -> None:
    oid = launch(api)
    drain(api.queue, skip_agents=("test-echo",))
    r = replan(api, oid, {"tasks": [{"id": "C", "agentId": "test-echo"}], "reason": "rethink"})
    assert r.status_code == 202, r.json
    assert r.json["objective"]["phase"] == 2
    drain(api.queue, skip_agents=("test-echo",))  # control stops phase 1 before A's job could run
    drain(api.queue)
    obj = api.client.get(f"/objectives/{oid}", headers=api.headers()).json["objective"]  # type: ignore[index]
    assert obj["status"] == "completed" and obj["phase"] == 2
    assert {t["id"]: (t["phase"], t["status"]) for t in obj["tasks"]} == {
        "A": (1, "canceled"),
        "B": (1, "canceled"),
        "C": (2, "completed"),
    }
    again = replan(api, oid, {"tasks": [{"id": "D", "agentId": "test-echo"}]})
    assert again.status_code == 409 and again.json["error"]["code"] == "conflict"


def test_bad_replans_are_400_naming_the_field_and_write_nothing(api: Api) -> None:
    oid = launch(api)
    before = _receipts(api, oid)
    cases = [
        ({"tasks": []}, "tasks"),
        ({}, "tasks"),
        ({"tasks": [{"id": "A", "agentId": "test-echo"}]}, "tasks[0].id"),
        ({"tasks": [{"id": "X", "dependsOn": ["nope"]}]}, "tasks[0].dependsOn"),
        (
            {"tasks": [{"id": "X", "payload": {"kind": "factory.objective.watchdog"}}]},
            "tasks[0].payload.kind",
        ),
        ({"tasks": [{"id": "X"}], "extra": 1}, "extra"),
    ]
    for body, field in cases:
        r = replan(api, oid, body)
        assert r.status_code == 400, (body, r.json)
        assert r.json["error"]["details"]["field"] == field, (body, r.json)
    assert _receipts(api, oid) == before


def test_another_organisation_cannot_replan(api: Api) -> None:
    oid = launch(api)
    assert replan(api, oid, {"tasks": [{"id": "C"}]}, who="b").status_code == 404


def test_openapi_documents_replan(api: Api) -> None:
    doc = api.client.get("/openapi.json", headers=api.headers()).json
    assert "post" in doc["paths"]["/objectives/{objectiveId}/plan"]  # type: ignore[index]
