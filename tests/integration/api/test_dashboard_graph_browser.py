"""The objective page's task graph in a real Chromium, updating live, through a sample reader.

The Factory is not in this branch, so the app serves a reader with objectives in the shape of
``GET /objectives/<id>`` (api/ui/objectives.py is the one seam to wire). The server is the real
app on a real socket (werkzeug, threaded) over SQLite; a receipt appended to the objective's
stream is what makes the page redraw, exactly as the Factory's receipts will.
"""

from __future__ import annotations

import copy
import os
import shutil
import threading
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
from werkzeug.serving import make_server

from api.ui.objective_views import FINDER_EXTENSION
from app.storage import store
from app.storage.db import transaction
from tests.integration.api.test_dashboard_system import FakeReader
from tests.support.api import ORG_A, Api, key
from tests.support.databases import IN_CI
from tests.support.processes import REPO_ROOT
from tests.unit.test_ui_graph import objective, task

pytestmark = pytest.mark.slow  # a real Chromium: make test runs it, make test-fast does not

CHROMIUM = os.environ.get("RECEIPT_TEST_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = REPO_ROOT / "test-artifacts" / "dashboard"
WAIT_MS = 30_000
STREAM = f"objectives/{ORG_A}/obj-1"

if not shutil.which(CHROMIUM):
    if IN_CI:
        pytest.fail(f"Chromium is not installed at {CHROMIUM} (.ci/run installs it)", pytrace=False)
    pytest.skip(f"Chromium is not installed at {CHROMIUM}", allow_module_level=True)

sync_api = pytest.importorskip("playwright.sync_api")


def release_plan() -> dict[str, Any]:
    """A plan a user would launch: build fans out to three checks, which fan in to a release."""
    plan = objective(
        task("plan", status="completed", attempt=1, jobId="obj-1:1:plan", result={"steps": 3}),
        task("build", "plan", status="completed", attempt=1, jobId="obj-1:1:build"),
        task("unit-tests", "build", status="running", attempt=1, jobId="obj-1:1:unit-tests"),
        task("lint", "build", status="completed", attempt=1, jobId="obj-1:1:lint"),
        task("integration", "build", status="failed", attempt=2, jobId="obj-1:1:integration", error="exit 1"),
        task("docs", "plan", status="queued", attempt=0, jobId="obj-1:1:docs"),
        task("release", "unit-tests", "lint", "integration", "docs", status="pending"),
    )
    plan.update(title="Release 2.0", goal="Build, check and document 2.0, then publish it.")
    # GET /objectives/<id> names the organisation and the streams the page follows.
    plan.update(organizationId=ORG_A, stream=STREAM)
    for t in plan["tasks"]:
        t["jobStream"] = f"jobs/{ORG_A}/{t['jobId']}" if t.get("jobId") else None
    return plan


class MutableReader(FakeReader):
    def set_status(self, task_id: str, status: str) -> None:
        for _org, o in self.objectives:
            for t in o["tasks"]:
                if t["id"] == task_id:
                    t["status"] = status


@pytest.fixture
def served(sqlite_api: Api) -> Iterator[tuple[str, MutableReader]]:
    reader = MutableReader([(ORG_A, copy.deepcopy(release_plan()))])
    sqlite_api.app.extensions[FINDER_EXTENSION] = lambda engine: reader
    server = make_server("127.0.0.1", 0, sqlite_api.app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", reader
    finally:
        server.shutdown()
        thread.join(timeout=10)
        server.server_close()


def _append(api: Api, stream: str, type_: str, body: Mapping[str, Any]) -> None:
    with transaction(api.engine) as conn:
        head = store.head(conn, stream)
        store.append(
            conn, stream, head.seq if head else 0, type_, dict(body), prev_hash=head.hash if head else None
        )


def test_the_task_graph_is_drawn_and_recoloured_live(
    sqlite_api: Api, served: tuple[str, MutableReader]
) -> None:
    base, reader = served
    _append(sqlite_api, STREAM, "objective.launched", {"objectiveId": "obj-1"})
    docs_job = key(sqlite_api.job(jobId="obj-1:1:docs"))  # the queued task "docs" has its job
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1360, "height": 760})
            page.set_default_timeout(WAIT_MS)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"{base}/ui/signin?next=/ui/objectives/obj-1")
            page.fill("#token", sqlite_api.secrets["a"])
            page.click("button[type=submit]")
            page.wait_for_url("**/ui/objectives/obj-1")
            link = page.locator('g[data-task-id="docs"] a').get_attribute("href")
            assert link == f"/ui/jobs/obj-1:1:docs?organizationId={ORG_A}"
            nodes = page.locator("svg.graph g.node")
            assert nodes.count() == 7
            assert page.locator("svg.graph path.edge").count() == 9
            assert page.locator('g[data-task-id="integration"]').get_attribute("data-status") == "failed"
            # Layers by dependency depth: plan, then build and docs, then the checks, then release.
            x = {
                n: page.locator(f'g[data-task-id="{n}"]').evaluate("g => g.transform.baseVal[0].matrix.e")
                for n in ("plan", "build", "docs", "lint", "release")
            }
            assert x["plan"] < x["build"] == x["docs"] < x["lint"] < x["release"]
            page.locator("[data-live-indicator]:not([hidden])").wait_for()
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "objective-graph.png"), full_page=True)

            page.evaluate("window.__noReload = 'still-here'")
            reader.set_status("unit-tests", "completed")
            _append(sqlite_api, STREAM, "objective.task_settled", {"taskId": "unit-tests"})
            page.locator('g[data-task-id="unit-tests"][data-status="completed"]').wait_for()
            assert page.evaluate("window.__noReload") == "still-here"
            fill = page.locator('g[data-task-id="unit-tests"] rect').get_attribute("fill")
            assert fill == "#e3f6e8"

            # A task's job starting appends no objective receipt: the page hears it on the
            # stream (a "task" event from the job's stream), with no timer to fall back on.
            reader.set_status("docs", "running")
            sqlite_api.lease_and_start(docs_job)
            page.locator('g[data-task-id="docs"][data-status="running"]').wait_for(timeout=4_000)
            assert page.evaluate("window.__noReload") == "still-here"
            assert errors == []
        finally:
            browser.close()
