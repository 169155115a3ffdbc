"""The dashboard over the Flask test client: sign-in and its cookie, CSRF, tenancy, filters, actions,
live endpoints and the no-secrets rule. The browser tests (tests/e2e/test_dashboard_browser.py)
drive the same pages in Chromium against real processes.
"""

from __future__ import annotations

import re
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any

import pytest
from werkzeug.test import TestResponse

from api.ui import session as ui_session
from app.config import Settings
from app.storage import tokens
from tests.support.api import ORG_A, ORG_B, WORKER, Api, EventReader, key, make_settings, payload

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone

SIGNIN = "/ui/signin"


@pytest.fixture
def api_settings(tmp_path: Path) -> Settings:
    # Streams live 30 s here, not the API suite's 3 s: on a loaded machine a stream that ends by
    # age between two events would fail a test about something else. Each test ends its own.
    return make_settings(tmp_path, sse_max_seconds=30)


def sign_in(api: Api, who: str = "a", base_url: str = "http://localhost") -> TestResponse:
    response = api.client.post(SIGNIN, data={"token": api.secrets[who]}, base_url=base_url)
    assert response.status_code == 302, response.get_data(as_text=True)
    return response


def set_cookie_header(response: TestResponse) -> str:
    headers = [v for k, v in response.headers.items() if k.lower() == "set-cookie"]
    assert len(headers) == 1, headers
    return headers[0]


def csrf_of(api: Api, path: str = "/ui/jobs") -> str:
    page = api.client.get(path).get_data(as_text=True)
    match = re.search(r'name="csrf" value="([0-9a-f]{64})"', page)
    assert match, "no CSRF field on the page"
    return match.group(1)


def text(response: TestResponse) -> str:
    return response.get_data(as_text=True)


# -- sign-in and the cookie --------------------------------------------------------------------


def test_every_page_but_sign_in_needs_a_session(sqlite_api: Api) -> None:
    assert sqlite_api.client.get(SIGNIN).status_code == 200
    for path in ("/ui/jobs", "/ui/system", "/ui/objectives", "/ui/jobs/x", "/ui/nowhere"):
        response = sqlite_api.client.get(path)
        assert response.status_code == 302, path
        assert response.headers["Location"].startswith("/ui/signin?next=")
    # Event streams and forms get a 401/403 rather than a redirect (nothing to show them).
    assert sqlite_api.client.get("/ui/jobs/x/events").status_code == 401
    assert sqlite_api.client.get("/ui/live/jobs").status_code == 401
    assert sqlite_api.client.post("/ui/jobs/x/cancel").status_code == 401


# What Chromium sends when a person types an address (Firefox's differs only in its list of images).
BROWSER_ACCEPT = (
    "text/html,application/xhtml+xml,application/xml;q=0.9,image/avif,image/webp,image/apng,"
    "*/*;q=0.8,application/signed-exchange;v=b3;q=0.7"
)


@pytest.mark.parametrize("path", ["/", "/ui"])
def test_a_browser_at_the_root_or_ui_lands_on_the_dashboard_then_sign_in(sqlite_api: Api, path: str) -> None:
    landed = sqlite_api.client.get(path, headers={"Accept": BROWSER_ACCEPT})
    assert landed.status_code == 302
    assert landed.headers["Location"] == "/ui/"
    signin = sqlite_api.client.get("/ui/", headers={"Accept": BROWSER_ACCEPT})
    assert (signin.status_code, signin.headers["Location"]) == (302, "/ui/signin?next=/ui/")
    signed_in = sqlite_api.client.post(
        "/ui/signin", data={"token": sqlite_api.secrets["a"], "next": "/ui/"}, base_url="http://localhost"
    )
    assert (signed_in.status_code, signed_in.headers["Location"]) == (302, "/ui/")
    home = sqlite_api.client.get("/ui/", headers={"Accept": BROWSER_ACCEPT})
    assert (home.status_code, home.headers["Location"]) == (302, "/ui/jobs")


@pytest.mark.parametrize("path", ["/", "/ui"])
@pytest.mark.parametrize(
    "accept",
    [None, "*/*", "application/json", "application/json, text/html", "text/html;q=0.5, application/json"],
)
def test_api_clients_at_the_root_or_ui_keep_their_json_401(
    sqlite_api: Api, path: str, accept: str | None
) -> None:
    headers = {"Accept": accept} if accept is not None else {}
    response = sqlite_api.client.get(path, headers=headers)
    assert response.status_code == 401
    assert response.mimetype == "application/json"
    assert response.get_json()["error"]["code"] == "unauthorized"


def test_a_browser_posting_to_the_root_is_not_redirected(sqlite_api: Api) -> None:
    response = sqlite_api.client.post("/", headers={"Accept": BROWSER_ACCEPT})
    assert response.status_code == 401
    assert response.mimetype == "application/json"


def test_a_signed_in_browser_at_the_root_reaches_the_jobs_page(sqlite_api: Api) -> None:
    sign_in(sqlite_api)
    response = sqlite_api.client.get("/", headers={"Accept": BROWSER_ACCEPT}, follow_redirects=True)
    assert response.status_code == 200
    assert response.request.path == "/ui/jobs"
    assert "data-live-indicator" in text(response)


def test_sign_in_sets_an_httponly_samesite_strict_cookie_scoped_to_ui(sqlite_api: Api) -> None:
    response = sign_in(sqlite_api)
    header = set_cookie_header(response)
    cookie = SimpleCookie()
    cookie.load(header)
    morsel = cookie[ui_session.COOKIE]
    assert morsel["httponly"] is True
    assert morsel["samesite"] == "Strict"
    assert morsel["path"] == "/ui"
    assert not morsel["secure"], "plain http: a Secure cookie would never come back"
    assert response.headers["Location"] == "/ui/jobs"


def test_the_cookie_is_secure_over_https(sqlite_api: Api) -> None:
    header = set_cookie_header(sign_in(sqlite_api, base_url="https://localhost"))
    assert "Secure" in header
    assert "HttpOnly" in header


def test_a_bad_token_is_refused_and_not_echoed(sqlite_api: Api) -> None:
    response = sqlite_api.client.post(SIGNIN, data={"token": "rcpt_not-a-real-token-zzz"})
    assert response.status_code == 401
    assert "set-cookie" not in {k.lower() for k, _ in response.headers.items()}
    assert "rcpt_not-a-real-token-zzz" not in text(response)
    assert "not valid" in text(response)


@pytest.mark.parametrize("secret", ["", "x" * 257, "rcpt_\x00", "rcpt_é", "a b\n", "Bearer "])
def test_malformed_tokens_are_refused_like_the_api_refuses_them(sqlite_api: Api, secret: str) -> None:
    response = sqlite_api.client.post(SIGNIN, data={"token": secret})
    assert response.status_code == 401
    assert "set-cookie" not in {k.lower() for k, _ in response.headers.items()}


def test_a_bearer_prefix_is_accepted(sqlite_api: Api) -> None:
    response = sqlite_api.client.post(SIGNIN, data={"token": "Bearer " + sqlite_api.secrets["a"]})
    assert response.status_code == 302


def test_sign_in_redirects_only_inside_the_dashboard(sqlite_api: Api) -> None:
    secret = sqlite_api.secrets["a"]
    ok = sqlite_api.client.post(SIGNIN, data={"token": secret, "next": "/ui/jobs?status=failed"})
    assert ok.headers["Location"] == "/ui/jobs?status=failed"
    for evil in ("https://evil.example/", "//evil.example/ui", "/uix", "/jobs", "/ui\\@evil"):
        response = sqlite_api.client.post(SIGNIN, data={"token": secret, "next": evil})
        assert response.headers["Location"] == "/ui/jobs", evil


def test_sign_out_clears_the_cookie(sqlite_api: Api) -> None:
    sign_in(sqlite_api)
    csrf = csrf_of(sqlite_api)
    response = sqlite_api.client.post("/ui/signout", data={"csrf": csrf})
    assert response.status_code == 302
    assert "receipt_ui=;" in set_cookie_header(response)
    assert sqlite_api.client.get("/ui/jobs").status_code == 302


def test_a_revoked_token_ends_the_session(sqlite_api: Api) -> None:
    sign_in(sqlite_api)
    assert sqlite_api.client.get("/ui/jobs").status_code == 200
    assert tokens.revoke(sqlite_api.engine, sqlite_api.secrets["a"])
    assert sqlite_api.client.get("/ui/jobs").status_code == 302


def test_the_json_api_does_not_accept_the_cookie(sqlite_api: Api) -> None:
    job = sqlite_api.job()
    sign_in(sqlite_api)
    assert sqlite_api.client.get("/jobs").status_code == 401
    assert sqlite_api.client.post(f"/jobs/{job['id']}/cancel", json={}).status_code == 401
    assert sqlite_api.client.get(f"/jobs/{job['id']}/events").status_code == 401


def test_pages_never_show_the_token(sqlite_api: Api) -> None:
    job = sqlite_api.job()
    sign_in(sqlite_api)
    secret = sqlite_api.secrets["a"]
    for path in ("/ui/jobs", f"/ui/jobs/{job['id']}", f"/ui/jobs/{job['id']}/fragment", "/ui/nowhere"):
        response = sqlite_api.client.get(path)
        assert secret not in text(response), path
        assert secret[5:25] not in text(response), path
    assert secret not in csrf_of(sqlite_api)


def test_dashboard_headers_forbid_framing_caching_and_inline_script(sqlite_api: Api) -> None:
    sign_in(sqlite_api)
    response = sqlite_api.client.get("/ui/jobs")
    assert "script-src 'self'" in response.headers["Content-Security-Policy"]
    assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]
    assert response.headers["X-Frame-Options"] == "DENY"
    assert response.headers["Cache-Control"] == "no-store"
    assert "<script>" not in text(response)


# -- CSRF --------------------------------------------------------------------------------------


def test_a_form_without_the_csrf_token_changes_nothing(sqlite_api: Api) -> None:
    job = sqlite_api.job()
    sign_in(sqlite_api)
    before = sqlite_api.receipt_count()
    for data in ({}, {"csrf": "0" * 64}, {"csrf": ""}):
        response = sqlite_api.client.post(f"/ui/jobs/{job['id']}/cancel", data=data)
        assert response.status_code == 403
    assert sqlite_api.receipt_count() == before
    assert sqlite_api.queue.get(key(job)).status == "queued"  # type: ignore[union-attr]


def test_a_post_from_another_origin_is_refused(sqlite_api: Api) -> None:
    job = sqlite_api.job()
    sign_in(sqlite_api)
    csrf = csrf_of(sqlite_api)
    before = sqlite_api.receipt_count()
    response = sqlite_api.client.post(
        f"/ui/jobs/{job['id']}/cancel", data={"csrf": csrf}, headers={"Origin": "https://evil.example"}
    )
    assert response.status_code == 403
    assert sqlite_api.receipt_count() == before
    # Sign-in too (login CSRF would sign the victim into the attacker's organisation).
    refused = sqlite_api.client.post(
        SIGNIN, data={"token": sqlite_api.secrets["b"]}, headers={"Origin": "https://evil.example"}
    )
    assert refused.status_code == 403


def test_the_csrf_token_is_per_session(sqlite_api: Api) -> None:
    sign_in(sqlite_api)
    first = csrf_of(sqlite_api)
    sign_in(sqlite_api)
    second = csrf_of(sqlite_api)
    assert first != second
    job = sqlite_api.job()
    stale = sqlite_api.client.post(f"/ui/jobs/{job['id']}/cancel", data={"csrf": first})
    assert stale.status_code == 403


# -- actions -----------------------------------------------------------------------------------


def test_cancel_a_queued_job(api: Api) -> None:
    job = api.job()
    sign_in(api)
    response = api.client.post(f"/ui/jobs/{job['id']}/cancel", data={"csrf": csrf_of(api), "reason": "no"})
    assert response.status_code == 303
    assert response.headers["Location"] == f"/ui/jobs/{job['id']}?organizationId={ORG_A}&done=cancel"
    canceled = api.queue.get(key(job))
    assert canceled is not None and canceled.status == "canceled"
    page = text(api.client.get(response.headers["Location"]))
    assert "Cancel sent" in page
    assert 'data-testid="job-status">canceled<' in page


def test_cancel_a_running_job_sends_abort(api: Api) -> None:
    job = api.job()
    api.lease_and_start(key(job))
    sign_in(api)
    api.client.post(f"/ui/jobs/{job['id']}/cancel", data={"csrf": csrf_of(api)})
    running = api.queue.get(key(job))
    assert running is not None
    assert running.status == "running" and running.abort_requested
    assert [c.type for c in running.commands] == ["abort"]


def test_cancel_a_terminal_job_is_a_409_page(sqlite_api: Api) -> None:
    job = sqlite_api.job()
    sqlite_api.queue.cancel(key(job))
    sign_in(sqlite_api)
    response = sqlite_api.client.post(f"/ui/jobs/{job['id']}/cancel", data={"csrf": csrf_of(sqlite_api)})
    assert response.status_code == 409
    assert "already canceled" in text(response)


def test_steer_and_follow_up_go_through_the_command_schema(sqlite_api: Api) -> None:
    job = sqlite_api.job()
    sign_in(sqlite_api)
    csrf = csrf_of(sqlite_api)
    url = f"/ui/jobs/{job['id']}/commands"
    ok = sqlite_api.client.post(url, data={"csrf": csrf, "type": "steer", "payload": '{"say": "left"}'})
    assert ok.status_code == 303
    follow = sqlite_api.client.post(url, data={"csrf": csrf, "type": "follow_up", "reason": "more"})
    assert follow.status_code == 303
    commands = sqlite_api.queue.get(key(job)).commands  # type: ignore[union-attr]
    assert [(c.type, c.lane, c.payload, c.reason) for c in commands] == [
        ("steer", "steer", {"say": "left"}, None),
        ("follow_up", "follow_up", None, "more"),
    ]
    before = sqlite_api.receipt_count()
    bad_json = sqlite_api.client.post(url, data={"csrf": csrf, "type": "steer", "payload": "{nope"})
    assert bad_json.status_code == 400
    assert "payload" in text(bad_json)
    bad_type = sqlite_api.client.post(url, data={"csrf": csrf, "type": "abort"})
    assert bad_type.status_code == 400
    assert "steer, follow_up" in text(bad_type)
    nul = sqlite_api.client.post(url, data={"csrf": csrf, "type": "steer", "reason": "a\x00b"})
    assert nul.status_code == 400
    long_reason = sqlite_api.client.post(url, data={"csrf": csrf, "type": "steer", "reason": "x" * 5000})
    assert long_reason.status_code == 400
    assert sqlite_api.receipt_count() == before


# -- tenancy -----------------------------------------------------------------------------------


def test_another_organisations_job_is_the_same_404_as_an_unknown_one(api: Api) -> None:
    theirs = api.job("a", payload=payload(org=ORG_A, secretPlan="alpha-plan"))
    sign_in(api, "b")
    csrf = csrf_of(api)
    unknown = api.client.get("/ui/jobs/no-such-job")
    foreign = api.client.get(f"/ui/jobs/{theirs['id']}")
    assert foreign.status_code == unknown.status_code == 404
    assert text(foreign).replace(theirs["id"], "X") == text(unknown).replace("no-such-job", "X")
    assert "alpha-plan" not in text(foreign)
    before = api.receipt_count()
    for path in ("fragment", "events"):
        assert api.client.get(f"/ui/jobs/{theirs['id']}/{path}").status_code == 404
    assert api.client.post(f"/ui/jobs/{theirs['id']}/cancel", data={"csrf": csrf}).status_code == 404
    command = api.client.post(f"/ui/jobs/{theirs['id']}/commands", data={"csrf": csrf, "type": "steer"})
    assert command.status_code == 404
    assert api.receipt_count() == before
    listing = text(api.client.get("/ui/jobs"))
    assert theirs["id"] not in listing
    # An organisation token cannot widen its scope with ?org= (the API's 403), but may name its own.
    widened = api.client.get(f"/ui/jobs?org={ORG_A}")
    assert widened.status_code == 403
    assert theirs["id"] not in text(widened)
    assert api.client.get(f"/ui/jobs?org={ORG_B}").status_code == 200
    # Nor can it name A's organisation on a job's page (a system identity's right only).
    for path in ("", "/fragment", "/events"):
        named = api.client.get(f"/ui/jobs/{theirs['id']}{path}?organizationId={ORG_A}")
        assert named.status_code == 403, path
        assert "alpha-plan" not in text(named)
    named_cancel = api.client.post(
        f"/ui/jobs/{theirs['id']}/cancel?organizationId={ORG_A}", data={"csrf": csrf}
    )
    assert named_cancel.status_code == 403
    assert api.receipt_count() == before


def test_a_system_token_sees_every_organisation_and_can_narrow(sqlite_api: Api) -> None:
    a = sqlite_api.job("a")
    b = sqlite_api.job("b")
    sign_in(sqlite_api, "system")
    listing = text(sqlite_api.client.get("/ui/jobs"))
    assert a["id"] in listing and b["id"] in listing
    only_b = text(sqlite_api.client.get(f"/ui/jobs?org={ORG_B}"))
    assert b["id"] in only_b and a["id"] not in only_b
    # Each row links to its job in the job's organisation; the page names it, or acts in the
    # system token's own organisation (where A's id is unknown).
    link = f"/ui/jobs/{a['id']}?organizationId={ORG_A}"
    assert f'href="{link}"' in listing
    page = sqlite_api.client.get(link)
    assert page.status_code == 200 and 'data-testid="job-status">queued<' in text(page)
    assert sqlite_api.client.get(f"/ui/jobs/{a['id']}").status_code == 404


# -- the list: filters, counts, paging ---------------------------------------------------------


def _rows(response: TestResponse) -> list[str]:
    return re.findall(r'<tr data-job-id="([^"]+)"', text(response))


def test_filters_combine_and_counts_ignore_the_status_filter(sqlite_api: Api) -> None:
    chat = sqlite_api.job(jobId="alpha-1", lane="chat")
    codex = sqlite_api.job(agent="codex", jobId="beta-2")
    control = sqlite_api.job(agent="factory-control", jobId="alpha-3")
    # Integration kinds run commands: the system token posts it, for organisation a.
    integration = sqlite_api.job("system", jobId="gamma-4", payload=payload("factory.integration.publish"))
    sqlite_api.queue.cancel(key(control))
    sign_in(sqlite_api)
    get = sqlite_api.client.get
    assert set(_rows(get("/ui/jobs"))) == {"alpha-1", "beta-2", "alpha-3", "gamma-4"}
    assert _rows(get("/ui/jobs?status=canceled")) == ["alpha-3"]
    assert _rows(get("/ui/jobs?agent=codex")) == ["beta-2"]
    assert _rows(get("/ui/jobs?lane=chat")) == [chat["id"]]
    assert set(_rows(get("/ui/jobs?group=codex"))) == {codex["id"], integration["id"]}
    assert _rows(get("/ui/jobs?group=control")) == ["alpha-3"]
    assert _rows(get("/ui/jobs?group=chat")) == ["alpha-1"]
    assert set(_rows(get("/ui/jobs?q=alpha"))) == {"alpha-1", "alpha-3"}
    assert _rows(get("/ui/jobs?q=alpha&status=queued")) == ["alpha-1"]
    assert _rows(get("/ui/jobs?q=%25")) == []  # LIKE wildcards are matched literally
    page = text(get("/ui/jobs?status=queued"))
    assert 'data-count="queued">3<' in page
    assert 'data-count="canceled">1<' in page


@pytest.mark.parametrize(
    ("query", "field", "allowed"),
    [
        ("status=done", "status", "queued, leased, running, completed, failed, canceled"),
        ("lane=fast", "lane", "chat, collect, steer, follow_up"),
        ("group=gpu", "group", "chat, codex, control"),
        ("cursor=bm90LWEtY3Vyc29y", "cursor", ""),
        ("q=a%00b", "q", ""),
    ],
)
def test_a_bad_filter_is_a_400_naming_it(sqlite_api: Api, query: str, field: str, allowed: str) -> None:
    sign_in(sqlite_api)
    response = sqlite_api.client.get(f"/ui/jobs?{query}")
    assert response.status_code == 400
    assert f"{field}:" in text(response)
    assert allowed in text(response)


def test_paging_walks_every_job_once(sqlite_api: Api) -> None:
    ids = [sqlite_api.job(jobId=f"job-{i:03d}")["id"] for i in range(55)]
    sign_in(sqlite_api)
    first = sqlite_api.client.get("/ui/jobs")
    first_rows = _rows(first)
    assert len(first_rows) == 50
    match = re.search(r'href="([^"]+)" data-testid="next-page"', text(first))
    assert match
    second = sqlite_api.client.get(match.group(1).replace("&amp;", "&"))
    second_rows = _rows(second)
    assert sorted(first_rows + second_rows) == sorted(ids)
    assert 'data-testid="next-page"' not in text(second)
    assert "data-live-url" not in text(second)  # only the first page follows live


# -- the job page ------------------------------------------------------------------------------


def test_job_page_shows_the_timeline_with_attempts_workers_and_the_error(api: Api) -> None:
    job = api.job(maxAttempts=1)
    attempt = api.lease_and_start(key(job))
    api.queue.progress(key(job), "worker-1", attempt, {"step": 1})
    api.queue.heartbeat(key(job), "worker-1", attempt, 60_000)
    api.queue.heartbeat(key(job), "worker-1", attempt, 60_000)
    api.queue.heartbeat(key(job), "someone-else", attempt, 60_000)  # inert: not the lease holder
    api.queue.command(key(job), "steer", {"go": "left"}, "why not")
    api.queue.fail(key(job), "worker-1", attempt, "boom: disk full", retryable=False)
    sign_in(api)
    page = text(api.client.get(f"/ui/jobs/{job['id']}"))
    types = re.findall(r'data-type="([^"]+)"', page)
    assert types == [
        "job.enqueued",
        "job.leased",
        "job.heartbeat",
        "job.progress",
        "job.heartbeat",
        "queue.command",
        "job.failed",
    ]
    assert "\u00d72" in page  # two heartbeats of one attempt collapse into one row
    assert "attempt 1" in page and "worker-1" in page
    assert "boom: disk full" in page
    assert 'data-testid="job-status">failed<' in page
    # The actions are hidden once the job is terminal, and the page stops following.
    assert 'id="job-actions" hidden' in page
    assert "data-events-url" not in page


def test_an_inert_receipt_is_marked(sqlite_api: Api) -> None:
    job = sqlite_api.job()
    attempt = sqlite_api.lease_and_start(key(job))
    # A heartbeat from a superseded worker appends nothing through the queue, so write one
    # directly the way a late message from a lost attempt would have been recorded.
    from app.storage import store
    from app.storage.db import transaction

    with transaction(sqlite_api.engine) as conn:
        head = store.head(conn, job["stream"])
        assert head is not None
        store.append(
            conn,
            head.stream,
            head.seq,
            "job.heartbeat",
            {"workerId": "ghost", "attempt": attempt + 5},
            prev_hash=head.hash,
        )
    sign_in(sqlite_api)
    page = text(sqlite_api.client.get(f"/ui/jobs/{job['id']}"))
    assert page.count(">inert<") == 1
    assert "ghost" in page


def test_a_task_job_links_to_its_objective(sqlite_api: Api) -> None:
    sqlite_api.objective(objectiveId="obj-9")
    job = sqlite_api.job(payload=payload("factory.task.run", objectiveId="obj-9", taskId="build"))
    sign_in(sqlite_api)
    page = text(sqlite_api.client.get(f"/ui/jobs/{job['id']}"))
    assert f'href="/ui/objectives/obj-9?organizationId={ORG_A}"' in page and "task build" in page


def test_payload_secrets_are_hidden(sqlite_api: Api) -> None:
    job = sqlite_api.job(
        payload=payload(apiKey="sk-live-123456", nested={"password": "hunter2", "ok": "visible-value"})
    )
    sqlite_api.queue.command(key(job), "steer", {"access_token": "tok-999"}, None)
    sign_in(sqlite_api)
    page = text(sqlite_api.client.get(f"/ui/jobs/{job['id']}"))
    for secret in ("sk-live-123456", "hunter2", "tok-999"):
        assert secret not in page
    assert "visible-value" in page
    assert "(hidden)" in page


def test_job_page_for_a_live_job_follows_it(sqlite_api: Api, open_events: Any) -> None:
    job = sqlite_api.job()
    sign_in(sqlite_api)
    page = text(sqlite_api.client.get(f"/ui/jobs/{job['id']}"))
    match = re.search(r'data-events-url="([^"]+)"', page)
    assert match
    url = match.group(1).replace("&amp;", "&")
    assert url == f"/ui/jobs/{job['id']}/events?organizationId={ORG_A}&after=1"
    reader: EventReader = open_events(sqlite_api.client, url, {})
    sqlite_api.queue.cancel(key(job))
    frame = reader.next_event()
    assert frame is not None and frame.event == "job"
    assert frame.data["status"] == "canceled"
    assert reader.next_event() is None  # a terminal job's stream ends


def test_the_live_list_sends_rows_and_counts(sqlite_api: Api, open_events: Any) -> None:
    sign_in(sqlite_api)
    reader: EventReader = open_events(sqlite_api.client, "/ui/live/jobs?status=queued", {})
    first = reader.next_event()
    assert first is not None and first.event == "jobs"
    assert first.data["counts"]["queued"] == 0
    job = sqlite_api.job()
    second = reader.next_event()
    assert second is not None
    assert f'data-job-id="{job["id"]}"' in second.data["html"]
    assert second.data["counts"]["queued"] == 1


def test_the_live_list_ends_when_the_token_is_revoked(
    sqlite_api: Api, open_events: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from api.ui import jobs_views

    monkeypatch.setattr(jobs_views, "SESSION_RECHECK_SECONDS", 0.0)
    sign_in(sqlite_api)
    reader: EventReader = open_events(sqlite_api.client, "/ui/live/jobs", {})
    assert reader.next_event() is not None
    assert tokens.revoke(sqlite_api.engine, sqlite_api.secrets["a"])
    comments = []
    while (frame := reader.next_frame()) is not None:
        comments.append(frame.comment)
    # It ended because of the revocation, not because its lifetime ran out.
    assert comments[-1] == "signed out"
    assert sqlite_api.client.get("/ui/live/jobs").status_code == 401


# -- the system page ----------------------------------------------------------------------------


def test_system_page_needs_a_system_token(sqlite_api: Api) -> None:
    sign_in(sqlite_api, "a")
    assert sqlite_api.client.get("/ui/system").status_code == 403
    assert "/ui/system" not in text(sqlite_api.client.get("/ui/jobs"))


def test_nothing_malformed_reaches_a_500(sqlite_api: Api) -> None:
    sign_in(sqlite_api)
    csrf = csrf_of(sqlite_api)
    job = sqlite_api.job()
    probes = [
        sqlite_api.client.get("/ui/jobs/%00"),
        sqlite_api.client.get("/ui/jobs/" + "x" * 3000),
        sqlite_api.client.get(f"/ui/jobs/{job['id']}/events?after=-5"),
        sqlite_api.client.get(f"/ui/jobs/{job['id']}/events", headers={"Last-Event-ID": "abc"}),
        sqlite_api.client.post(f"/ui/jobs/{job['id']}/commands", data={"csrf": csrf}),
        sqlite_api.client.post(
            f"/ui/jobs/{job['id']}/commands", data={"csrf": csrf, "type": "steer", "payload": "[" * 5000}
        ),
    ]
    for response in probes:
        assert 400 <= response.status_code < 500, (response.request.path, response.status_code)


def test_a_released_attempt_shows_on_the_job_page_and_its_timeline(sqlite_api: Api) -> None:
    """A worker shutting down handed the attempt back: the page says it was not charged."""
    job = sqlite_api.job(maxAttempts=1)
    k = key(job)
    attempt = sqlite_api.lease_and_start(k)
    assert not sqlite_api.queue.release(k, "another-worker", attempt, "shutdown").applied  # not the holder
    assert sqlite_api.queue.release(k, WORKER, attempt, "shutdown").applied
    sign_in(sqlite_api)
    page = text(sqlite_api.client.get(f"/ui/jobs/{job['id']}/fragment"))
    assert "(1 handed back, not charged)" in page
    assert "handed back (shutdown), not charged" in page
    listed = sqlite_api.client.get(f"/jobs/{job['id']}", headers=sqlite_api.headers("a")).get_json()["job"]
    assert (listed["status"], listed["attempt"], listed["released"]) == ("queued", 1, 1)


def test_the_search_filters_kind_tag_error_and_time(api: Api) -> None:
    tagged = api.job(jobId="tagged-1", tags={"customer": "acme"})
    api.job(jobId="other-2", tags={"customer": "globex"})
    task = api.job(agent="test-echo", jobId="task-3", payload=payload("factory.task.run"))
    api.queue.fail(key(task), None, None, "command exited with 1", retryable=False)
    sign_in(api)
    get = api.client.get
    assert _rows(get("/ui/jobs?tag=customer:acme")) == [tagged["id"]]
    assert _rows(get("/ui/jobs?kind=factory.task.run")) == ["task-3"]
    assert _rows(get("/ui/jobs?error=command+exited")) == ["task-3"]
    assert _rows(get("/ui/jobs?from=2999-01-01T00:00:00Z")) == []
    page = text(get("/ui/jobs?tag=customer:acme"))
    assert 'value="customer:acme"' in page  # the form keeps the filter
    for query, field in (("tag=nocolon", "tag"), ("kind=nope", "kind"), ("from=yesterday", "from")):
        response = get(f"/ui/jobs?{query}")
        assert response.status_code == 400
        assert f"{field}:" in text(response)
