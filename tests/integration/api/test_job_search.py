"""Tags on an enqueue, and GET /jobs filtered by organisation, agent, kind, status, tag, error
prefix and creation time (one keyset pager); a bad filter is a 400 naming it."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, update

from app.jobs.tags import TAG_KEY_MAX, TAG_VALUE_MAX, TAGS_MAX_KEYS
from app.storage import projection
from app.storage.db import iso as iso_text
from app.storage.db import job_tags, jobs, parse_iso, receipts, transaction
from tests.support.api import ORG_B, Api, json_of, key, payload


def _ids(api: Api, who: str = "a", **query: str) -> list[str]:
    response = api.client.get("/jobs", query_string=query, headers=api.headers(who))
    assert response.status_code == 200, response.json
    return [j["id"] for j in json_of(response)["jobs"]]


def _bad(api: Api, field: str, **query: str) -> dict[str, Any]:
    before = api.receipt_count()
    response = api.client.get("/jobs", query_string=query, headers=api.headers())
    assert response.status_code == 400, response.json
    error: dict[str, Any] = json_of(response)["error"]
    assert error["details"]["field"] == field, error
    assert api.receipt_count() == before
    return error


def test_tags_are_kept_in_job_enqueued_and_shown_on_the_job(api: Api) -> None:
    job = api.job(tags={"customer": "acme", "batch": "2026-05-01"})
    assert job["tags"] == {"batch": "2026-05-01", "customer": "acme"}
    with api.engine.connect() as conn:
        body = conn.execute(
            select(receipts.c.body).where(receipts.c.stream == job["stream"], receipts.c.seq == 1)
        ).scalar_one()
    assert body["tags"] == {"batch": "2026-05-01", "customer": "acme"}
    plain = api.job()
    assert "tags" not in plain  # an untagged job (and an old receipt) folds as before


def test_list_by_tag_kind_agent_status_and_error_prefix(api: Api) -> None:
    acme = api.job(tags={"customer": "acme"})
    other = api.job(tags={"customer": "globex"})
    task = api.job(agent="test-echo", payload=payload("factory.task.run"), tags={"customer": "acme"})
    failed = api.job(tags={"customer": "acme"})
    api.queue.fail(key(failed), None, None, "command exited with 1", retryable=False)
    dict_error = api.job()
    api.queue.fail(key(dict_error), None, None, {"message": "command exited with 2"}, retryable=False)

    assert _ids(api, tag="customer:acme") == [failed["id"], task["id"], acme["id"]]
    assert _ids(api, tag="customer:globex") == [other["id"]]
    assert _ids(api, tag="customer:nobody") == []
    assert _ids(api, kind="factory.task.run") == [task["id"]]
    assert _ids(api, kind="factory.task.run", agentId="factory") == []
    assert _ids(api, status="failed", tag="customer:acme") == [failed["id"]]
    assert _ids(api, errorPrefix="command exited with") == [dict_error["id"], failed["id"]]
    assert _ids(api, errorPrefix="command exited with 1") == [failed["id"]]
    assert _ids(api, errorPrefix="%") == []  # a LIKE wildcard is text, not a pattern


def test_list_by_creation_time_range_pages_with_the_one_cursor(api: Api) -> None:
    made = [api.job(tags={"run": "r1"}) for _ in range(5)]
    times = [parse_iso(j["createdAt"]) for j in made]
    assert all(t is not None for t in times)
    first, last = times[1], times[3]
    assert first is not None and last is not None
    after, before = iso_text(first), iso_text(last)
    assert after is not None and before is not None
    # [createdAfter, createdBefore): jobs 1 and 2 (same-microsecond neighbours are ordered by id).
    window = _ids(api, createdAfter=after, createdBefore=before, tag="run:r1")
    assert set(window) <= {made[1]["id"], made[2]["id"]} and made[1]["id"] in window
    seen: list[str] = []
    cursor = None
    while True:
        query = {"tag": "run:r1", "limit": "2"} | ({"cursor": cursor} if cursor else {})
        response = api.client.get("/jobs", query_string=query, headers=api.headers())
        body = json_of(response)
        seen += [j["id"] for j in body["jobs"]]
        cursor = body["nextCursor"]
        if cursor is None:
            break
    assert seen == [j["id"] for j in reversed(made)]
    later = iso_text(last + timedelta(days=1))
    assert later is not None
    assert _ids(api, createdAfter=later) == []
    assert _ids(api, createdAfter=later, createdBefore=after) == []  # an empty range: nothing


def test_a_filter_never_reaches_another_organisation(api: Api) -> None:
    mine = api.job(tags={"customer": "acme"})
    theirs = api.job("b", payload=payload(org=ORG_B), tags={"customer": "acme"})
    assert _ids(api, "a", tag="customer:acme") == [mine["id"]]
    assert _ids(api, "b", tag="customer:acme") == [theirs["id"]]
    # A system token sees both, or narrows to the organisation it names.
    assert set(_ids(api, "system", tag="customer:acme")) == {mine["id"], theirs["id"]}
    assert _ids(api, "system", tag="customer:acme", organizationId=ORG_B) == [theirs["id"]]
    # An organisation token naming another organisation is refused, never widened.
    response = api.client.get(
        "/jobs", query_string={"tag": "customer:acme", "organizationId": ORG_B}, headers=api.headers("a")
    )
    assert response.status_code == 403


@pytest.mark.parametrize(
    ("field", "query"),
    [
        ("kind", {"kind": "no.such.kind"}),
        ("status", {"status": "done"}),
        ("tag", {"tag": "no-colon"}),
        ("tag", {"tag": ":value"}),
        ("tag", {"tag": "key:"}),
        ("createdAfter", {"createdAfter": "yesterday"}),
        ("createdAfter", {"createdAfter": "2026-05-01T09:00:00"}),  # no offset
        ("errorPrefix", {"errorPrefix": " "}),
        ("errorPrefix", {"errorPrefix": "x" * 257}),
        ("tags", {"tags": "a:b"}),  # the enqueue's field, not a filter
    ],
)
def test_a_bad_filter_is_a_400_naming_it(api: Api, field: str, query: dict[str, str]) -> None:
    _bad(api, field, **query)


def test_kind_400_lists_the_kinds(api: Api) -> None:
    error = _bad(api, "kind", kind="nope")
    assert "factory.task.run" in error["details"]["allowed"]


@pytest.mark.parametrize(
    ("tags", "field", "says"),
    [
        ({f"k{i}": "v" for i in range(TAGS_MAX_KEYS + 1)}, "tags", f"at most {TAGS_MAX_KEYS}"),
        ({"bad key": "v"}, "tags", "letters, digits"),
        ({"k" * (TAG_KEY_MAX + 1): "v"}, "tags", str(TAG_KEY_MAX)),
        ({"ok": "v" * (TAG_VALUE_MAX + 1)}, "tags.ok", str(TAG_VALUE_MAX)),
        ({"ok": ""}, "tags.ok", str(TAG_VALUE_MAX)),
        ({"ok": 3}, "tags.ok", "string"),
        ({"ok": "line\nbreak"}, "tags.ok", "control"),
        (["a"], "tags", "object"),
    ],
)
def test_bad_tags_are_a_400_naming_the_field_and_the_limit(
    api: Api, tags: Any, field: str, says: str
) -> None:
    before = api.receipt_count()
    response = api.enqueue(tags=tags)
    assert response.status_code == 400, response.json
    error = json_of(response)["error"]
    assert error["details"]["field"] == field or error["details"]["field"].startswith(field + "."), error
    assert says in error["message"], error
    assert api.receipt_count() == before


def test_the_search_columns_are_rebuilt_from_receipts(api: Api) -> None:
    tagged = api.job(tags={"customer": "acme"})
    failed = api.job()
    api.queue.fail(key(failed), None, None, "command exited with 1", retryable=False)

    def columns() -> dict[str, tuple[Any, Any]]:
        with api.engine.connect() as conn:
            rows = conn.execute(select(jobs.c.id, jobs.c.tags, jobs.c.error_text)).all()
        return {r.id: (r.tags, r.error_text) for r in rows}

    live = columns()
    assert live[key(tagged)] == ({"customer": "acme"}, None)
    assert live[key(failed)] == (None, "command exited with 1")
    with transaction(api.engine) as conn:
        projection.rebuild(conn)
    assert columns() == live


def _tag_rows(api: Api) -> list[tuple[Any, ...]]:
    with api.engine.connect() as conn:
        rows = conn.execute(select(job_tags).order_by(job_tags.c.job_id, job_tags.c.key)).all()
    return [(r.job_id, r.key, r.value, r.organization_id, parse_iso(iso_text(r.created_at))) for r in rows]


def _expected_tag_rows(api: Api) -> list[tuple[Any, ...]]:
    """``job_tags`` as the ``jobs`` rows say it should be: one row per tag of each job."""
    with api.engine.connect() as conn:
        rows = conn.execute(select(jobs.c.id, jobs.c.tags, jobs.c.organization_id, jobs.c.created_at)).all()
    out = [
        (r.id, k, v, r.organization_id, parse_iso(iso_text(r.created_at)))
        for r in rows
        for k, v in (r.tags or {}).items()
    ]
    return sorted(out, key=lambda t: (t[0], t[1]))


def test_the_tag_projection_follows_every_writer_and_is_rebuilt_from_receipts(api: Api) -> None:
    single = api.job(tags={"customer": "acme", "batch": "b1"})
    api.job()  # untagged: no row
    batch = api.client.post(
        "/jobs:batch",
        json={"items": [{"agentId": "factory", "payload": payload(), "tags": {"customer": "globex"}}]},
        headers=api.headers(),
    )
    assert batch.status_code == 202, batch.json
    failed = api.job(tags={"customer": "initech"})
    api.queue.fail(key(failed), None, None, "command exited with 1", retryable=False)
    replayed = api.client.post(f"/jobs/{failed['id']}/replay", json={}, headers=api.headers())
    assert replayed.status_code == 202, replayed.json
    api.job("b", payload=payload(org=ORG_B), tags={"customer": "acme"})
    live = _tag_rows(api)
    assert live == _expected_tag_rows(api)
    assert len(live) == 6  # 2 + 1 + 1 + the replay's copy of its source's tag + B's 1
    assert (key(single), "customer", "acme", single["organizationId"], parse_iso(single["createdAt"])) in live

    # Damage the projection (it is not append-only), then rebuild it from receipts.
    with transaction(api.engine) as conn:
        conn.execute(job_tags.delete().where(job_tags.c.key == "batch"))
        conn.execute(update(job_tags).values(value="forged"))
    assert _tag_rows(api) != live
    with transaction(api.engine) as conn:
        projection.rebuild(conn)
    assert _tag_rows(api) == live
    assert _ids(api, tag="customer:acme") == [single["id"]]


def test_a_tag_filter_pages_like_every_other_filter(api: Api) -> None:
    """The tag walk (``job_tags``) and the plain walk (``jobs``) give the same pages and cursors."""
    made = []
    for i in range(7):
        job = api.job(tags={"run": "p"}, payload=payload("factory.task.run" if i % 2 else "factory.run"))
        if i % 3 == 0:
            api.queue.fail(key(job), None, None, f"exit {i}", retryable=False)
        made.append(job)
    api.job("b", payload=payload(org=ORG_B), tags={"run": "p"})  # never on A's pages

    def pages(**query: str) -> list[list[str]]:
        out, cursor = [], None
        while True:
            q = {**query, "limit": "2"} | ({"cursor": cursor} if cursor else {})
            body = json_of(api.client.get("/jobs", query_string=q, headers=api.headers()))
            out.append([j["id"] for j in body["jobs"]])
            cursor = body["nextCursor"]
            if cursor is None:
                return out

    newest_first = [j["id"] for j in reversed(made)]
    assert [i for p in pages(tag="run:p") for i in p] == newest_first
    assert pages(tag="run:p") == pages()  # every job of A's is tagged: the same pages as its whole list
    failed = [j["id"] for i, j in reversed(list(enumerate(made))) if i % 3 == 0]
    assert [i for p in pages(tag="run:p", status="failed") for i in p] == failed
    tasks = [j["id"] for i, j in reversed(list(enumerate(made))) if i % 2]
    assert [i for p in pages(tag="run:p", kind="factory.task.run") for i in p] == tasks
