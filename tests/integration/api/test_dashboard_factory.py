"""The objective pages over the real Factory, through ``api.ui.objectives.FactoryReader``.

Skipped where the Factory is not installed (the pages then answer 501: test_dashboard_system.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from api.ui.objective_views import FINDER_EXTENSION
from app.storage import tokens
from tests.integration.api.test_dashboard import sign_in, text
from tests.support.api import ORG_A, ORG_B, Api

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone

pytest.importorskip("app.factory.service", reason="the Factory is not in this build")


def _task(task_id: str, *deps: str) -> dict[str, Any]:
    return {
        "id": task_id,
        "agentId": "codex",
        "dependsOn": list(deps),
        "payload": {"kind": "factory.task.run", "command": ["python3", "-c", "print(1)"]},
    }


def launch(api: Api, objective_id: str, who: str = "a") -> dict[str, Any]:
    body = {
        "objectiveId": objective_id,
        "title": "Diamond",
        "goal": "Fetch, check twice, report.",
        "plan": {"tasks": [_task("A"), _task("B", "A"), _task("C", "A"), _task("D", "B", "C")]},
    }
    # Codex tasks run commands: launching them needs the `commands` scope.
    org = ORG_B if who == "b" else ORG_A
    secret = tokens.create(api.engine, org, scopes=("commands",))[1]
    r = api.client.post("/objectives", json=body, headers={"Authorization": f"Bearer {secret}"})
    assert r.status_code == 202, r.json
    objective: dict[str, Any] = r.json["objective"]  # type: ignore[index]
    return objective


def test_the_factory_is_wired(sqlite_api: Api) -> None:
    sign_in(sqlite_api)
    assert FINDER_EXTENSION not in sqlite_api.app.extensions  # no stand-in: the Factory's own reader
    assert sqlite_api.client.get("/ui/objectives").status_code == 200


def test_objective_pages_show_the_factorys_objectives(api: Api) -> None:
    launch(api, "obj-dash-a", "a")
    launch(api, "obj-dash-b", "b")
    sign_in(api, "a")
    listing = api.client.get("/ui/objectives")
    assert listing.status_code == 200
    assert "obj-dash-a" in text(listing) and "obj-dash-b" not in text(listing)
    page = api.client.get("/ui/objectives/obj-dash-a")
    assert page.status_code == 200
    body = text(page)
    assert body.count('class="node task-') == 4
    assert body.count('class="edge') == 4
    assert 'data-task-id="D" data-status="pending"' in body
    assert api.client.get("/ui/objectives/obj-dash-b").status_code == 404
    assert api.client.get("/ui/objectives/obj-dash-b/events").status_code == 404
    # A system token lists every organisation's; one page acts in the organisation it names.
    sign_in(api, "system")
    assert api.client.get("/ui/objectives/obj-dash-b").status_code == 404
    named = api.client.get(f"/ui/objectives/obj-dash-b?organizationId={ORG_B}")
    assert named.status_code == 200 and text(named).count('class="node task-') == 4
    listing_all = text(api.client.get("/ui/objectives"))
    assert f'href="/ui/objectives/obj-dash-a?organizationId={ORG_A}"' in listing_all
    assert f'href="/ui/objectives/obj-dash-b?organizationId={ORG_B}"' in listing_all
