"""Bulk actions and dead letters in a real headless Chromium: select everything a filter matches,
confirm with the dry run's count and sample, and watch the operation run page after page to done;
replay a dead letter group from its view. The real app on a real socket (werkzeug, threaded) over
SQLite, as tests/integration/api/test_dashboard_graph_browser.py runs it."""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import quote

import pytest
from werkzeug.serving import make_server

from api.ui import bulk_views
from tests.support.api import ORG_A, Api, key, payload
from tests.support.databases import IN_CI
from tests.support.processes import REPO_ROOT

pytestmark = pytest.mark.slow  # a real Chromium: make test runs it, make test-fast does not

CHROMIUM = os.environ.get("RECEIPT_TEST_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = REPO_ROOT / "test-artifacts" / "dashboard"
WAIT_MS = 30_000

if not shutil.which(CHROMIUM):
    if IN_CI:
        pytest.fail(f"Chromium is not installed at {CHROMIUM} (.ci/run installs it)", pytrace=False)
    pytest.skip(f"Chromium is not installed at {CHROMIUM}", allow_module_level=True)

sync_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture
def served(sqlite_api: Api, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    # Two jobs a request: the page runs several pages, as it would for thousands of jobs.
    monkeypatch.setattr(bulk_views, "UI_PAGE", 2)
    server = make_server("127.0.0.1", 0, sqlite_api.app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        thread.join(timeout=10)
        server.server_close()


def _failed(api: Api, tag: str, error: str = "command exited with 1") -> dict[str, Any]:
    job = api.job(payload=payload(org=ORG_A), tags={"run": tag})
    api.queue.fail(key(job), None, None, error, retryable=False)
    return job


def _signed_in(p: Any, base: str, api: Api, path: str) -> tuple[Any, Any, list[str]]:
    browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
    page = browser.new_page(viewport={"width": 1360, "height": 900})
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{base}/ui/signin?next={quote(path, safe='/')}")
    page.fill("#token", api.secrets["a"])
    page.click("button[type=submit]")
    return browser, page, errors


def test_select_everything_confirm_and_watch_a_bulk_replay_to_the_end(sqlite_api: Api, served: str) -> None:
    made = [_failed(sqlite_api, "browser") for _ in range(5)]
    sqlite_api.job(tags={"run": "browser"})  # queued: outside the status filter
    with sync_api.sync_playwright() as p:
        browser, page, errors = _signed_in(p, served, sqlite_api, "/ui/jobs?tag=run:browser&status=failed")
        try:
            page.wait_for_url("**/ui/jobs?*")
            assert page.locator('[data-testid="matching"]').inner_text() == "5"
            # The action asks for the selection first (the checkbox is required).
            page.click('[data-testid="bulk-replay"]')
            assert "/ui/jobs/bulk" not in page.url
            page.check('[data-testid="select-all"]')
            page.click('[data-testid="bulk-replay"]')
            page.wait_for_url("**/ui/jobs/bulk?*")
            assert page.locator('[data-testid="bulk-title"]').inner_text() == "Replay 5 jobs?"
            assert page.locator('[data-testid="bulk-sample"] tr').count() == 5
            page.click('[data-testid="bulk-submit"]')
            page.wait_for_url("**/ui/operations/**")
            # The page runs the remaining pages itself and shows the progress as it goes.
            page.locator('[data-testid="operation-done"]').wait_for()
            assert page.locator('[data-testid="operation-status"]').inner_text() == "done"
            assert (
                "5 of 5 processed · 5 replayed · 0 skipped"
                in page.locator('[data-testid="operation-counts"]').inner_text()
            )
            assert page.locator('[data-testid="operation-progress"]').get_attribute("value") == "100"
            assert not page.locator('[data-testid="operation-next"]').is_visible()
            page.screenshot(path=str(_artifact("bulk-replay-done.png")))
            assert errors == []
        finally:
            browser.close()
    for job in made:
        replayed = sqlite_api.queue.get(key(job))
        assert replayed is not None and len(replayed.replayed_as) == 1


def test_replay_a_dead_letter_group_from_its_view(sqlite_api: Api, served: str) -> None:
    for _ in range(3):
        _failed(sqlite_api, "dlb", error="command exited with 2")
    _failed(sqlite_api, "dlb", error="timeout after 600 s")
    with sync_api.sync_playwright() as p:
        browser, page, errors = _signed_in(p, served, sqlite_api, "/ui/dead-letters")
        try:
            page.wait_for_url("**/ui/dead-letters")
            assert page.locator('[data-testid="dead-letter-count"]').inner_text() == "4"
            page.locator('[data-testid="replay-error"]').first.click()
            page.wait_for_url("**/ui/jobs/bulk?*")
            assert page.locator('[data-testid="bulk-title"]').inner_text() == "Replay 3 jobs?"
            page.click('[data-testid="bulk-submit"]')
            page.locator('[data-testid="operation-done"]').wait_for()
            assert "3 replayed" in page.locator('[data-testid="operation-counts"]').inner_text()
            assert errors == []
        finally:
            browser.close()


def _artifact(name: str) -> Any:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    return ARTIFACTS / name
