"""The dashboard in a real headless Chromium (Debian's), against real gunicorn, Celery workers and beat
on PostgreSQL and Redis.

Sign in, watch a job appear and go to ``completed`` without a reload, open its timeline, cancel a
running job, and find another organisation's job unreachable. Screenshots of each step are saved
under ``test-artifacts/dashboard/`` (gitignored); ``docs/screenshots/`` holds copies for the README.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from app.storage import tokens
from devharness import handlers
from tests.support.databases import IN_CI
from tests.support.processes import REPO_ROOT, Harness
from tests.support.stack import ORG, Stack, make_stack

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e")]

CHROMIUM = os.environ.get("RECEIPT_TEST_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = REPO_ROOT / "test-artifacts" / "dashboard"
OTHER_ORG = "e2e-other-org"
# Browser-side waits: generous, because six helpers share two cores.
WAIT_MS = 45_000
UI_LEASE_MS = 180_000

if not shutil.which(CHROMIUM):
    if IN_CI:
        pytest.fail(f"Chromium is not installed at {CHROMIUM} (.ci/run installs it)", pytrace=False)
    pytest.skip(f"Chromium is not installed at {CHROMIUM}", allow_module_level=True)

sync_api = pytest.importorskip("playwright.sync_api")


@pytest.fixture(scope="module")
def ui_stack(
    module_harness: Harness, module_database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    """web, driver, the chat worker group and beat: what the dashboard's jobs need."""
    # A long lease: the harness's 6 s lease would time a job out (5 s) while a loaded machine is
    # still rendering the page the test is about to click on.
    stack = make_stack(
        module_harness, module_database_url, tmp_path_factory.mktemp("ui-home"), JOB_LEASE_MS=str(UI_LEASE_MS)
    )
    try:
        stack.start("web", "driver", "chat", "beat")
        yield stack
    finally:
        stack.close()
        module_harness.stop_all()


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        # --no-sandbox: the test runs as root in a container, where Chromium's sandbox cannot start.
        launched = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture
def page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1360, "height": 860})
    context.set_default_timeout(WAIT_MS)
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda exc: errors.append(str(exc)))
    yield opened
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    opened.screenshot(path=str(ARTIFACTS / f"{request.node.name}-final.png"), full_page=True)
    context.close()
    assert errors == [], f"JavaScript errors on the page: {errors}"


def shot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def sign_in(page: Any, stack: Stack, secret: str) -> None:
    page.goto(stack.url("/ui/jobs"))
    assert "/ui/signin" in page.url  # every page but sign-in needs the session
    page.fill("#token", secret)
    page.click("button[type=submit]")
    page.wait_for_url("**/ui/jobs")


def post_as(stack: Stack, secret: str, org: str, agent: str, **payload: Any) -> dict[str, Any]:
    body = {
        "payload": {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": org}, **payload}
    }
    r = requests.post(
        stack.url(f"/agents/{agent}/jobs"),
        json=body,
        headers={"Authorization": f"Bearer {secret}"},
        timeout=15,
    )
    assert r.status_code == 202, r.text
    job: dict[str, Any] = r.json()["job"]
    return job


def test_sign_in_then_a_job_appears_and_completes_live(ui_stack: Stack, page: Any, tmp_path: Path) -> None:
    s = ui_stack
    page.goto(s.url("/ui/signin"))
    shot(page, "signin")
    sign_in(page, s, s.token)
    cookie = next(c for c in page.context.cookies() if c["name"] == "receipt_ui")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/ui"
    assert page.evaluate("document.cookie") == ""  # HttpOnly: no script can read the token
    assert s.token not in page.content()

    # Mark this document: if anything reloads the page, the mark is gone.
    page.evaluate("window.__noReload = 'still-here'")
    page.wait_for_selector("[data-live-indicator]:not([hidden])")
    gate = tmp_path / "gate"
    job = s.post_job(handlers.GATE, gate=str(gate))
    row = page.locator(f'tr[data-job-id="{job["id"]}"]')
    row.locator("[data-status]", has_text="running").wait_for()
    shot(page, "jobs-running")
    gate.touch()
    row.locator("[data-status]", has_text="completed").wait_for()
    assert page.evaluate("window.__noReload") == "still-here"
    assert page.locator('[data-count="completed"]').inner_text() != "0"
    shot(page, "jobs")
    # Filters: choosing a status applies it; the job is under "completed" and not under "failed".
    page.select_option("form.filters select[name=status]", "completed")
    page.wait_for_url("**/ui/jobs?status=completed**")
    assert row.count() == 1
    page.select_option("form.filters select[name=status]", "failed")
    page.wait_for_url("**/ui/jobs?status=failed**")
    assert row.count() == 0
    page.goto(s.url("/ui/jobs"))

    # Its timeline: enqueued → lease → heartbeat → completed, with attempt, worker and result.
    row.locator("a").click()
    page.wait_for_url(f"**/ui/jobs/{job['id']}?**")
    page.locator('[data-testid="job-status"]', has_text="completed").wait_for()
    types = page.locator("ol.timeline li").evaluate_all("items => items.map(li => li.dataset.type)")
    assert types[0] == "job.enqueued" and types[-1] == "job.completed"
    assert "job.leased" in types and "job.heartbeat" in types
    timeline = page.locator('[data-testid="timeline"]').inner_text()
    assert "attempt 1" in timeline
    assert '"gated": true' in page.locator('[data-testid="job-result"]').inner_text()
    assert page.locator("#job-actions").is_hidden()  # nothing to do to a finished job
    shot(page, "job-timeline")


def test_cancel_a_running_job_from_its_page(ui_stack: Stack, page: Any) -> None:
    s = ui_stack
    sign_in(page, s, s.token)
    job = s.post_job(handlers.WAIT_CANCEL, seconds=UI_LEASE_MS / 1000)
    page.goto(s.url(f"/ui/jobs/{job['id']}"))
    page.locator('[data-testid="job-status"]', has_text="running").wait_for()
    shot(page, "job-running")
    page.fill("#job-actions input[name=reason]", "from the dashboard")
    page.click('[data-testid="cancel"]')
    page.locator('[data-testid="notice"]').wait_for()
    # The worker honours the abort; the page follows the job to its end without a reload.
    page.locator('[data-testid="job-status"]', has_text="canceled").wait_for()
    done = s.wait_terminal(job["id"], timeout=30)
    assert done.status == "canceled"
    assert [c.reason for c in done.commands if c.type == "abort"] == ["from the dashboard"]
    assert page.locator("#job-actions").is_hidden()
    shot(page, "job-canceled")


def test_another_organisations_job_is_not_reachable(ui_stack: Stack, page: Any) -> None:
    s = ui_stack
    _info, other_secret = tokens.create(s.engine, OTHER_ORG)
    marker = f"private-{uuid.uuid4().hex}"
    theirs = post_as(s, other_secret, OTHER_ORG, handlers.ECHO, message=marker)
    sign_in(page, s, s.token)
    response = page.goto(s.url(f"/ui/jobs/{theirs['id']}"))
    assert response is not None and response.status == 404
    body = page.content()
    assert marker not in body and OTHER_ORG not in body
    shot(page, "job-of-another-organisation")
    unknown = page.goto(s.url("/ui/jobs/no-such-job-at-all"))
    assert unknown is not None and unknown.status == 404
    assert page.locator('[data-testid="error"] p').first.inner_text() == "no job with that id"
    page.goto(s.url(f"/ui/jobs?q={theirs['id']}"))
    assert page.locator(f'tr[data-job-id="{theirs["id"]}"]').count() == 0
    # A cancel aimed at it from this session is refused the same way, and writes nothing.
    before = s.types(theirs["id"])
    page.goto(s.url("/ui/jobs"))
    status = page.evaluate(
        """async ([url]) => {
            const csrf = document.querySelector('input[name=csrf]').value;
            const body = new URLSearchParams({csrf});
            const r = await fetch(url, {method: 'POST', body, redirect: 'manual'});
            return r.status;
        }""",
        [s.url(f"/ui/jobs/{theirs['id']}/cancel")],
    )
    assert status == 404
    assert s.types(theirs["id"]) == before


def test_revoking_the_token_stops_live_updates_and_says_so(ui_stack: Stack, page: Any) -> None:
    s = ui_stack
    _info, secret = tokens.create(s.engine, ORG)
    sign_in(page, s, secret)
    page.wait_for_selector("[data-live-indicator]:not([hidden])")
    assert page.locator("[data-stale-notice]").is_hidden()
    assert tokens.revoke(s.engine, secret)
    # The live list re-checks its token every 10 s; the browser's reconnect then gets a 401.
    page.locator("[data-stale-notice]").wait_for(state="visible")
    page.reload()
    assert "/ui/signin" in page.url


def test_system_page_for_a_system_token(ui_stack: Stack, page: Any) -> None:
    s = ui_stack
    # Another organisation's job of its own: this test must not depend on another test having run
    # on the same xdist worker (each worker has its own module stack).
    _info, other_secret = tokens.create(s.engine, OTHER_ORG)
    theirs = post_as(s, other_secret, OTHER_ORG, handlers.ECHO, message="for the system view")
    failing = s.post_job(handlers.FAIL, retryable=False)
    echo = s.post_job(handlers.ECHO, message="hello")
    sign_in(page, s, s.system_token)
    # A system token's list spans every organisation, with an organisation column and filter.
    page.locator(f'tr[data-job-id="{failing["id"]}"] [data-status]', has_text="failed").wait_for()
    page.locator(f'tr[data-job-id="{echo["id"]}"] [data-status]', has_text="completed").wait_for()
    assert page.locator("input[name=org]").count() == 1
    assert page.locator(f'tr[data-job-id="{theirs["id"]}"]', has_text=OTHER_ORG).count() == 1
    shot(page, "jobs-all-organisations")
    page.goto(s.url("/ui/system"))
    # The chat worker answers Celery's broadcast: one consumer, named.
    consumers = page.locator('tr[data-queue="receipt-chat"] [data-consumers]').inner_text()
    assert consumers.startswith("1: "), consumers
    assert page.locator('tr[data-queue="receipt-chat"] [data-depth]').inner_text().isdigit()
    page.locator('tr[data-loop="lease-expiry"]').wait_for()
    shot(page, "system")


@pytest.mark.parametrize("path", ["/ui", "/"])
def test_typing_the_printed_address_lands_on_sign_in_then_the_jobs_list(
    ui_stack: Stack, page: Any, path: str
) -> None:
    """What a newcomer types: the URL `receipt up` prints (``/``) or the README's ``/ui``."""
    s = ui_stack
    job = s.post_job(handlers.ECHO, message="seen after signing in")
    response = page.goto(s.url(path))
    assert response is not None and response.status == 200  # the redirects were followed
    assert page.url == s.url("/ui/signin?next=/ui/")
    assert page.locator("#token").is_visible()
    page.fill("#token", s.token)
    page.click("button[type=submit]")
    page.wait_for_url("**/ui/jobs")
    page.locator(f'tr[data-job-id="{job["id"]}"]').wait_for()
    shot(page, f"landing-{'root' if path == '/' else 'ui'}")
