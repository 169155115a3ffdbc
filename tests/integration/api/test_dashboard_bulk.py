"""The dashboard's bulk actions and dead letters over the Flask test client: select everything a
filter matches, confirm with the dry run, run the operation page by page, follow its progress;
the dead-letter view per agent and kind with its replays. Tenancy, CSRF and bad input as the API's.
The browser test (tests/integration/api/test_dashboard_bulk_browser.py) drives the same pages."""

from __future__ import annotations

import html
import re
from pathlib import Path
from typing import Any

import pytest

from api.ui import bulk_views
from app.config import Settings
from app.ops.bulk_actions import operation_stream
from app.storage import store
from tests.integration.api.test_dashboard import csrf_of, sign_in, text
from tests.support.api import ORG_A, ORG_B, Api, EventReader, json_of, key, make_settings, payload

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone


@pytest.fixture
def api_settings(tmp_path: Path) -> Settings:
    return make_settings(tmp_path, sse_max_seconds=30)


def _failed(api: Api, tag: str, who: str = "a", error: str = "command exited with 1") -> dict[str, Any]:
    org = ORG_B if who == "b" else ORG_A
    job = api.job(who, payload=payload(org=org), tags={"run": tag})
    api.queue.fail(key(job), None, None, error, retryable=False)
    return job


def _form_fields(page: str) -> dict[str, str]:
    """The hidden and named inputs of the confirm page's form (what a browser would post)."""
    form = page.split('data-testid="bulk-form"', 1)[1].split("</form>", 1)[0]
    fields = dict(re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)"', form))
    return {k: html.unescape(v) for k, v in fields.items()}


def _types(api: Api, stream: str) -> list[str]:
    with api.engine.connect() as conn:
        return [r.type for r in store.read_stream(conn, stream)]


def test_the_jobs_page_selects_everything_its_filter_matches(api: Api) -> None:
    for _ in range(3):
        _failed(api, "sel")
    api.job(tags={"run": "sel"})
    sign_in(api)
    page = text(api.client.get("/ui/jobs", query_string={"tag": "run:sel", "status": "failed"}))
    assert 'data-testid="matching">3<' in page
    assert 'name="session"' in page  # every filter of the API is on the page
    form = page.split('data-testid="bulk"', 1)[1].split("</form>", 1)[0]
    assert 'name="tag" value="run:sel"' in form and 'name="status" value="failed"' in form
    assert all(f'value="{a}"' in form for a in ("cancel", "replay", "archive"))
    # Filters the API cannot express: no bulk action, and the page says why.
    grouped = text(api.client.get("/ui/jobs", query_string={"group": "chat"}))
    assert 'data-testid="bulk-note"' in grouped and 'data-testid="select-all"' not in grouped


def test_a_system_session_names_the_organisation_it_acts_in(api: Api) -> None:
    _failed(api, "sys")
    _failed(api, "sys", who="b")
    sign_in(api, "system")
    page = text(api.client.get("/ui/jobs", query_string={"tag": "run:sys"}))
    assert "Name an organisation" in page and 'data-testid="select-all"' not in page
    refused = api.client.get("/ui/jobs/bulk", query_string={"action": "replay", "tag": "run:sys"})
    assert refused.status_code == 403 and "org is required for a system token" in text(refused)
    named = text(
        api.client.get("/ui/jobs/bulk", query_string={"action": "replay", "tag": "run:sys", "org": ORG_B})
    )
    assert 'data-count="1"' in named and f"operations/{ORG_B}/" in named


def test_confirm_shows_the_dry_run_and_runs_the_operation_page_by_page(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = [_failed(api, "run") for _ in range(5)]
    _failed(api, "run", who="b")  # never reached
    sign_in(api)
    before = api.receipt_count()
    confirm = api.client.get("/ui/jobs/bulk", query_string={"action": "replay", "tag": "run:run", "all": "1"})
    assert confirm.status_code == 200
    page = text(confirm)
    assert 'data-count="5"' in page and "Replay 5 jobs?" in page
    assert page.count("<tr data-job-id=") == 5  # the sample
    assert api.receipt_count() == before  # a dry run writes nothing
    fields = _form_fields(page)
    assert fields["action"] == "replay" and fields["tag"] == "run:run" and fields["key"].startswith("ui-")

    monkeypatch.setattr(bulk_views, "UI_PAGE", 2)
    started = api.client.post("/ui/jobs/bulk", data=fields)
    assert started.status_code == 303
    where = started.headers["Location"]
    assert where == f"/ui/operations/{fields['key']}?organizationId={ORG_A}&drive=1"
    # The same form posted twice (a double click) is one operation.
    assert api.client.post("/ui/jobs/bulk", data=fields).status_code == 303
    stream = operation_stream(ORG_A, fields["key"])
    assert _types(api, stream) == ["operation.started", "operation.page"]

    shown = text(api.client.get(where))
    assert 'data-drive="true"' in shown and 'data-processed="2"' in shown and 'data-matched="5"' in shown
    found = re.search(r'action="([^"]+)" class="action" id="operation-next"', shown)
    assert found is not None
    next_url = html.unescape(found.group(1))
    assert next_url.startswith(f"/ui/operations/{fields['key']}/next")
    answers = []
    while True:
        response = api.client.post(
            next_url, data={"csrf": fields["csrf"]}, headers={"Accept": "application/json"}
        )
        assert response.status_code == 200, text(response)
        answers.append(json_of(response))
        if answers[-1]["done"]:
            break
    assert [a["processed"] for a in answers] == [4, 5]
    # Done: nothing more happens, however often it is asked.
    assert json_of(
        api.client.post(next_url, data={"csrf": fields["csrf"]}, headers={"Accept": "application/json"})
    )["done"]
    assert _types(api, stream) == ["operation.started", *["operation.page"] * 3]
    done = text(api.client.get(where))
    assert 'data-testid="operation-done"' in done and 'id="operation-next"' not in done
    for job in made:
        shown_job = json_of(api.client.get(f"/jobs/{job['id']}", headers=api.headers()))["job"]
        assert len(shown_job["replayedAs"]) == 1
    # The API reads the same operation.
    via_api = json_of(api.client.get(f"/operations/{fields['key']}", headers=api.headers()))["operation"]
    assert (via_api["affected"], via_api["done"], via_api["pages"]) == (5, True, 3)


def test_a_plain_continue_form_returns_to_the_operation(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    for _ in range(3):
        _failed(api, "plain")
    sign_in(api)
    fields = _form_fields(
        text(api.client.get("/ui/jobs/bulk", query_string={"action": "archive", "tag": "run:plain"}))
    )
    monkeypatch.setattr(bulk_views, "UI_PAGE", 2)
    where = api.client.post("/ui/jobs/bulk", data=fields).headers["Location"]
    back = api.client.post(
        f"/ui/operations/{fields['key']}/next?organizationId={ORG_A}", data={"csrf": fields["csrf"]}
    )
    assert back.status_code == 303 and back.headers["Location"] == where
    body = text(api.client.get(f"/ui/operations/{fields['key']}/fragment?organizationId={ORG_A}"))
    assert 'data-done="true"' in body and "3 archived" in body


def test_the_operation_page_follows_its_audit_stream(
    api: Api, open_events: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    for _ in range(3):
        _failed(api, "live")
    sign_in(api)
    fields = _form_fields(
        text(api.client.get("/ui/jobs/bulk", query_string={"action": "cancel", "tag": "run:live"}))
    )
    monkeypatch.setattr(bulk_views, "UI_PAGE", 1)
    api.client.post("/ui/jobs/bulk", data=fields)
    page = text(api.client.get(f"/ui/operations/{fields['key']}?organizationId={ORG_A}"))
    url = html.unescape(re.search(r'data-events-url="([^"]+)"', page).group(1))  # type: ignore[union-attr]
    reader: EventReader = open_events(api.client, url, {})
    seen = [reader.next_event(), reader.next_event()]
    assert [f.data["type"] for f in seen if f is not None] == ["operation.started", "operation.page"]
    api.client.post(
        f"/ui/operations/{fields['key']}/next?organizationId={ORG_A}", data={"csrf": fields["csrf"]}
    )
    frame = reader.next_event()
    assert frame is not None and frame.event == "receipt" and frame.data["body"]["skipped"] == 1


def test_bulk_forms_need_the_csrf_token_and_bad_input_is_a_400(api: Api) -> None:
    _failed(api, "bad")
    sign_in(api)
    fields = _form_fields(
        text(api.client.get("/ui/jobs/bulk", query_string={"action": "replay", "tag": "run:bad"}))
    )
    before = api.receipt_count()
    assert api.client.post("/ui/jobs/bulk", data={**fields, "csrf": ""}).status_code == 403
    for query, field in (
        ({"action": "delete"}, "action"),
        ({"action": "replay", "kind": "nope"}, "kind"),
        ({"action": "replay", "tag": "nocolon"}, "tag"),
        ({"action": "replay", "from": "monday"}, "from"),
        ({"action": "replay", "q": "x"}, "q"),
    ):
        response = api.client.get("/ui/jobs/bulk", query_string=query)
        assert response.status_code == 400, query
        assert field in text(response), (query, text(response))
    allowed = text(api.client.get("/ui/jobs/bulk", query_string={"action": "delete"}))
    assert "cancel" in allowed and "archive" in allowed
    bad_key = api.client.post("/ui/jobs/bulk", data={**fields, "key": "bad key"})
    assert bad_key.status_code == 400 and "key" in text(bad_key)
    assert api.receipt_count() == before


def test_another_organisations_operation_is_not_there(api: Api) -> None:
    _failed(api, "mine")
    sign_in(api)
    fields = _form_fields(
        text(api.client.get("/ui/jobs/bulk", query_string={"action": "replay", "tag": "run:mine"}))
    )
    api.client.post("/ui/jobs/bulk", data=fields)
    sign_in(api, "b")
    for path in ("", "/fragment", "/events"):
        theirs = api.client.get(f"/ui/operations/{fields['key']}{path}")
        nobody = api.client.get(f"/ui/operations/never-used{path}")
        assert theirs.status_code == nobody.status_code == 404, path
    csrf = csrf_of(api)
    assert api.client.post(f"/ui/operations/{fields['key']}/next", data={"csrf": csrf}).status_code == 404


def test_the_dead_letter_view_groups_counts_and_replays(api: Api) -> None:
    for _ in range(3):
        _failed(api, "dl", error="command exited with 2")
    _failed(api, "dl", error="timeout after 600 s")
    api.job(tags={"run": "dl"})  # queued: not a dead letter
    _failed(api, "dl", who="b")  # another organisation's
    sign_in(api)
    page = text(api.client.get("/ui/dead-letters"))
    assert "<strong>4</strong> dead letters" in page
    assert 'data-testid="dead-letter-count">4<' in page
    assert "command exited with 2" in page and "timeout after 600 s" in page
    links = [
        html.unescape(u) for u in re.findall(r'href="([^"]+)" data-testid="replay-(?:group|error)"', page)
    ]
    assert len(links) == 3  # the group, and each of its two errors
    by_error = next(u for u in links if "error=" in u and "exited" in u)
    confirm = text(api.client.get(by_error))
    assert 'data-count="3"' in confirm and "Replay 3 jobs?" in confirm
    group = text(api.client.get(links[0]))
    assert 'data-count="4"' in group
    # Narrowed by the API's filters; a bad one is a 400 naming it.
    assert 'data-testid="dead-letter-count">1<' in text(
        api.client.get("/ui/dead-letters", query_string={"error": "timeout"})
    )
    assert api.client.get("/ui/dead-letters", query_string={"kind": "nope"}).status_code == 400


def test_a_system_session_names_the_organisation_of_its_dead_letters(api: Api) -> None:
    _failed(api, "sysdl")
    sign_in(api, "system")
    asks = text(api.client.get("/ui/dead-letters"))
    assert 'data-testid="dead-letters-org"' in asks and 'data-testid="dead-letters"' not in asks
    named = text(api.client.get("/ui/dead-letters", query_string={"org": ORG_A}))
    assert "<strong>1</strong> dead letter" in named
    link = html.unescape(re.search(r'href="([^"]+)" data-testid="replay-group"', named).group(1))  # type: ignore[union-attr]
    assert f"org={ORG_A}" in link
    assert 'data-count="1"' in text(api.client.get(link))
