"""Bounds per tenant: page bytes, commands per job, open streams, write rate."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from flask import Flask, g, request
from sqlalchemy.engine import Engine

from api.auth import Identity
from api.errors import ApiError, register_error_handlers
from api.limits import (
    ENVELOPE_BYTES,
    KEY_PREFIX,
    SLICE_MAX,
    STORAGE_RETRY_S,
    WriteLimit,
    _slice,
    count_items,
    fit,
    install_rate_limit,
    json_size,
)
from app.config import Settings
from app.storage import tokens
from tests.support.api import ORG_A, Api, build_api, json_of, key, make_settings, payload
from tests.support.queue_ops import complete

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone

# -- pages capped in bytes -------------------------------------------------------------------------

BIG = "x" * 3000  # each job carries ~3 KB of payload


def test_fit_keeps_what_fits_and_always_at_least_one() -> None:
    items = [{"v": "a" * 100}] * 10
    one = json_size(items[0]) + 1
    assert fit(items, ENVELOPE_BYTES + 3 * one) == 3
    assert fit(items, ENVELOPE_BYTES + 10 * one) == 10
    assert fit([{"v": "a" * 5000}], 100) == 1  # a single huge item is still sent alone
    assert fit([], 10) == 0


@pytest.fixture
def small_pages(engine: Engine, tmp_path: Path) -> Iterator[Api]:
    built = build_api(engine, make_settings(tmp_path, max_page_bytes=ENVELOPE_BYTES + 8000))
    yield built
    assert built.state.internal_errors == 0


def test_a_jobs_page_over_the_byte_cap_is_cut_and_its_cursor_continues(small_pages: Api) -> None:
    api = small_pages
    posted = [api.job(payload=payload(note=BIG))["id"] for _ in range(5)]
    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        query = {"limit": 50, **({"cursor": cursor} if cursor else {})}
        response = api.client.get("/jobs", query_string=query, headers=api.headers())
        assert response.status_code == 200
        assert len(response.get_data()) <= ENVELOPE_BYTES + 8000
        body = response.json
        assert body is not None
        seen += [j["id"] for j in body["jobs"]]
        pages += 1
        cursor = body["nextCursor"]
        if cursor is None:
            break
        assert pages < 10
    assert pages >= 2  # 5 jobs of ~3 KB do not fit in 8 KB
    assert sorted(seen) == sorted(posted) and len(seen) == len(set(seen))  # nothing lost, nothing twice


def test_a_receipts_page_over_the_byte_cap_is_cut_and_next_after_continues(small_pages: Api) -> None:
    api = small_pages
    job = api.job(payload=payload(note=BIG))
    for n in range(6):
        api.client.post(
            f"/jobs/{job['id']}/commands",
            json={"type": "steer", "payload": BIG + str(n)},
            headers=api.headers(),
        )
    url = f"/streams/{job['stream']}/receipts"
    seqs: list[int] = []
    after = 0
    while after is not None:
        body = api.client.get(url, query_string={"after": after, "limit": 100}, headers=api.headers()).json
        assert body is not None and body["receipts"]
        seqs += [r["seq"] for r in body["receipts"]]
        after = body["nextAfter"]
    assert seqs == list(range(1, 8))


# -- commands per job ------------------------------------------------------------------------------


@pytest.fixture
def capped(engine: Engine, tmp_path: Path) -> Iterator[Api]:
    built = build_api(engine, make_settings(tmp_path, max_commands_per_job=3))
    yield built
    assert built.state.internal_errors == 0


def test_past_the_command_cap_a_job_answers_409_too_many_commands(capped: Api) -> None:
    api = capped
    job = api.job()
    url = f"/jobs/{job['id']}/commands"
    for _ in range(3):
        assert api.client.post(url, json={"type": "follow_up"}, headers=api.headers()).status_code == 202
    before = api.receipt_count()
    response = api.client.post(url, json={"type": "steer"}, headers=api.headers())
    assert response.status_code == 409
    error = json_of(response)["error"]
    assert error["code"] == "too_many_commands"
    assert "RECEIPT_MAX_COMMANDS_PER_JOB=3" in error["message"]
    assert api.receipt_count() == before
    # A steer through enqueue meets the same cap.
    session_job = api.job(sessionKey="s")
    for _ in range(3):
        api.client.post(
            f"/jobs/{session_job['id']}/commands", json={"type": "follow_up"}, headers=api.headers()
        )
    steered = api.enqueue(payload=payload(), sessionKey="s", singletonMode="steer")
    assert json_of(steered)["error"]["code"] == "too_many_commands"


def test_a_job_at_its_command_cap_can_still_be_canceled(capped: Api) -> None:
    api = capped
    job = api.job()
    api.lease_and_start(key(job))
    for _ in range(3):
        api.client.post(f"/jobs/{job['id']}/commands", json={"type": "follow_up"}, headers=api.headers())
    response = api.client.post(f"/jobs/{job['id']}/cancel", json={}, headers=api.headers())
    assert response.status_code == 202
    assert json_of(response)["job"]["abortRequested"] is True
    before = api.receipt_count()
    assert api.client.post(f"/jobs/{job['id']}/cancel", json={}, headers=api.headers()).status_code == 202
    assert api.receipt_count() == before  # already aborting, at its cap: nothing more is written


# -- event streams ---------------------------------------------------------------------------------


def _with(api: Api, **changes: Any) -> Settings:
    return replace(api.state.settings, **changes)


@pytest.fixture
def two_streams(sqlite_engine: Engine, tmp_path: Path) -> Iterator[Api]:
    built = build_api(
        sqlite_engine, make_settings(tmp_path, sse_max_streams_per_token=2, sse_max_streams_per_process=3)
    )
    yield built
    assert built.state.internal_errors == 0


def test_streams_per_token_and_per_process_are_capped_with_429(two_streams: Api, open_events: Any) -> None:
    api = two_streams
    job = api.job()
    url = f"/jobs/{job['id']}/events"
    first = open_events(api.client, url, api.headers())
    open_events(api.client, url, api.headers())
    refused = api.client.get(url, headers=api.headers())
    assert refused.status_code == 429
    assert json_of(refused)["error"]["code"] == "too_many_streams"
    assert int(refused.headers["Retry-After"]) > 0
    # Another token still has room, up to the process's limit of three (the system token names
    # the job's organisation).
    system_url = f"{url}?organizationId={ORG_A}"
    open_events(api.client, system_url, api.headers("system"))
    assert api.client.get(system_url, headers=api.headers("system")).status_code == 429
    # Closing a stream frees its slot.
    first.close()
    assert api.state.stream_slots.open_for(_token_id(api, "a")) == 1
    open_events(api.client, url, api.headers())


def _token_id(api: Api, who: str) -> str:
    with api.engine.connect() as conn:
        info = tokens.authenticate(conn, api.secrets[who])
    assert info is not None
    return info.id


def test_a_revoked_tokens_open_stream_ends_within_one_poll(sqlite_api: Api, open_events: Any) -> None:
    api = sqlite_api
    api.app.extensions["receipt"].settings = _with(api, sse_max_seconds=60)
    job = api.job()
    reader = open_events(api.client, f"/jobs/{job['id']}/events", api.headers())
    assert reader.next_event().id == 1
    assert tokens.revoke(api.engine, api.secrets["a"])
    frames = []
    while (frame := reader.next_frame()) is not None:
        frames.append(frame)
        assert len(frames) < 50
    assert reader.ended
    assert frames[-1].comment == "credentials revoked or expired"


def test_resuming_with_last_event_id_reads_from_that_seq_not_from_1(
    api: Api, open_events: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.storage import store

    job = api.job()
    attempt = api.lease_and_start(key(job))
    for n in range(5):
        api.queue.progress(key(job), "worker-1", attempt, {"step": n})
    reads: list[int] = []
    real = store.read_stream

    def spy(conn: Any, stream: str, *, after: int = 0, limit: int | None = None) -> Any:
        reads.append(after)
        return real(conn, stream, after=after, limit=limit)

    complete(api.queue, key(job), "worker-1", attempt, "done")
    # Spy from here on: settling reads the stream for the durable ledger (after commit), and that
    # read is not the follower's.
    monkeypatch.setattr(store, "read_stream", spy)
    head = 9  # enqueued, leased, heartbeat, 5 progress, completed
    caught_up = open_events(
        api.client, f"/jobs/{job['id']}/events", api.headers(**{"Last-Event-ID": str(head)})
    )
    assert caught_up.rest() == []
    assert reads and min(reads) == head  # the job follower started at its resume point
    reads.clear()
    raw = open_events(api.client, f"/streams/{job['stream']}/events", api.headers(**{"Last-Event-ID": "7"}))
    assert [f.id for f in raw.rest()] == [8, 9]
    assert min(reads) == 7


# -- writes per organisation -----------------------------------------------------------------------


def test_writes_past_the_organisations_rate_limit_get_429_with_retry_after(
    engine: Engine, tmp_path: Path, redis_url: str
) -> None:
    api = build_api(engine, make_settings(tmp_path, rate_limit_writes="3/minute", redis_url=redis_url))
    statuses = [api.enqueue().status_code for _ in range(3)]
    assert statuses == [202, 202, 202]
    before = api.receipt_count()
    limited = api.enqueue()
    assert limited.status_code == 429
    assert json_of(limited)["error"]["code"] == "rate_limited"
    assert 0 < int(limited.headers["Retry-After"]) <= 61  # the window, rounded up
    assert api.receipt_count() == before  # nothing written
    # Another organisation has its own budget; reads are not limited; system tokens are exempt.
    assert api.enqueue("b").status_code == 202
    assert api.client.get("/jobs", headers=api.headers()).status_code == 200
    system = {"payload": payload(org=ORG_A)}
    assert (
        api.client.post("/agents/factory/jobs", json=system, headers=api.headers("system")).status_code == 202
    )
    # The counter is in Redis: a second API process over the same Redis sees the same budget.
    other = build_api(engine, make_settings(tmp_path, rate_limit_writes="3/minute", redis_url=redis_url))
    _info, secret = tokens.create(engine, ORG_A)
    other.secrets["a"] = secret
    assert other.enqueue().status_code == 429
    assert api.state.internal_errors == 0 and other.state.internal_errors == 0


def test_the_embedded_rate_limit_counts_in_memory_and_can_be_disabled(
    sqlite_engine: Engine, tmp_path: Path
) -> None:
    memory = build_api(sqlite_engine, make_settings(tmp_path, rate_limit_writes="2/minute"))
    assert [memory.enqueue().status_code for _ in range(3)] == [202, 202, 429]
    off = build_api(sqlite_engine, make_settings(tmp_path, rate_limit_writes="disabled"))
    assert {off.enqueue().status_code for _ in range(5)} == {202}


def test_rate_limit_default_is_per_minute_above_what_one_client_loop_reaches() -> None:
    # One Client.enqueue loop reached about 100/s here (bench/client_loop_bench.py): a default of
    # 20000/minute leaves it more than 3x headroom (docs/security.md, "Bounds per tenant").
    assert Settings().rate_limit_writes == "20000/minute"
    assert Settings().max_commands_per_job == 1000


def test_an_unreachable_rate_limit_storage_does_not_stop_writes_it_counts_in_memory(
    sqlite_engine: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Nothing listens on port 1: every Redis call fails at once (connection refused).
    settings = make_settings(tmp_path, rate_limit_writes="2/minute", redis_url="redis://127.0.0.1:1/0")
    api = build_api(sqlite_engine, settings)
    with caplog.at_level(logging.WARNING, logger="receipt.api"):
        statuses = [api.enqueue().status_code for _ in range(3)]
    assert statuses == [202, 202, 429]
    assert "falling back to in-memory storage" in caplog.text
    assert api.state.internal_errors == 0


def test_the_write_limit_goes_back_to_the_shared_storage_once_it_answers_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [100.0]
    limit = WriteLimit("5/minute", "memory://", clock=lambda: now[0])
    app = Flask("limit-under-test")
    app.add_url_rule("/agents/<agentId>/jobs", "jobs.enqueue", lambda agentId: "", methods=["POST"])
    shared_hits: list[str] = []
    real_hit = limit.shared.hit

    def failing_hit(*args: Any, **kwargs: Any) -> bool:
        raise ConnectionError("storage down")

    def counting_hit(*args: Any, **kwargs: Any) -> bool:
        shared_hits.append("hit")
        return real_hit(*args, **kwargs)

    def post() -> None:
        with app.test_request_context("/agents/a/jobs", method="POST"):
            assert request.endpoint == "jobs.enqueue"
            g.identity = Identity(ORG_A, system=False)
            limit.check()

    monkeypatch.setattr(limit.shared, "hit", failing_hit)
    post()  # the shared storage fails: this write is counted in memory instead
    assert limit.fallback.get_window_stats(limit.items[0], *_keys()).remaining == 4
    monkeypatch.setattr(limit.shared, "hit", counting_hit)
    now[0] += STORAGE_RETRY_S / 2
    post()  # within the retry interval: still memory, the shared storage is not asked
    assert shared_hits == []
    now[0] += STORAGE_RETRY_S
    post()  # past it: the storage answers its check, and counting goes back to it
    assert shared_hits == ["hit"]


def _writes(limit: WriteLimit, n: int, org: str = ORG_A) -> list[int]:
    """``n`` single writes of ``org`` through ``limit``: 202 for each counted, 429 for each refused."""
    app = Flask("slices-under-test")
    app.add_url_rule("/agents/<agentId>/jobs", "jobs.enqueue", lambda agentId: "", methods=["POST"])
    out = []
    for _ in range(n):
        with app.test_request_context("/agents/a/jobs", method="POST"):
            g.identity = Identity(org, system=False)
            try:
                limit.check()
                out.append(202)
            except ApiError as exc:
                out.append(exc.status)
    return out


def test_single_writes_take_a_slice_of_the_window_from_redis_at_a_time(redis_url: str) -> None:
    """One storage round trip serves a slice of writes (a 64th of the window's allowance, at most
    64): the shared count moves by whole slices, and never past the limit."""
    limit = WriteLimit("6400/minute", redis_url)
    item = limit.items[0]
    assert _slice(item) == SLICE_MAX == 64

    def used() -> int:
        return item.amount - limit.shared.get_window_stats(item, *_keys()).remaining

    assert _writes(limit, 1) == [202] and used() == 64
    assert _writes(limit, 63) == [202] * 63 and used() == 64
    assert _writes(limit, 1) == [202] and used() == 128
    # A limit under 128 a window is counted one write at a time, as every limit was.
    assert _slice(WriteLimit("127/minute", redis_url).items[0]) == 1


def test_two_processes_taking_slices_never_pass_the_limit_together(redis_url: str) -> None:
    """The last writes of a window are counted one at a time (a slice no longer fits), so the two
    processes' writes stop at the limit; what is refused early is at most the other's unspent slice."""
    a, b = WriteLimit("256/minute", redis_url), WriteLimit("256/minute", redis_url)
    assert _slice(a.items[0]) == 4
    statuses = []
    for _ in range(140):
        statuses += _writes(a, 1, org="org-slices") + _writes(b, 1, org="org-slices")
    accepted = statuses.count(202)
    assert 256 - _slice(a.items[0]) <= accepted <= 256
    assert statuses[-2:] == [429, 429]


def _keys() -> tuple[str, str, str]:
    return (KEY_PREFIX, f"org:{ORG_A}", "jobs.enqueue")


# -- a request that carries several items ------------------------------------------------------------


def bulk_app(settings: Settings) -> tuple[Flask, WriteLimit]:
    """A stand-in for a bulk route: the caller's organisation from a header, ``count_items`` per item."""
    app = Flask("bulk-under-test")
    register_error_handlers(app, lambda: None)

    @app.before_request
    def _identity() -> None:
        g.identity = Identity(request.headers["X-Org"], system=request.headers.get("X-System") == "1")

    limit = install_rate_limit(app, settings)
    assert limit is not None

    @app.post("/bulk")
    def bulk() -> Any:
        items = (request.get_json() or {})["items"]
        count_items(len(items))
        return {"accepted": len(items)}, 202

    return app, limit


def test_a_request_carrying_several_items_counts_each_of_them(tmp_path: Path, redis_url: str) -> None:
    app, limit = bulk_app(make_settings(tmp_path, rate_limit_writes="10/minute", redis_url=redis_url))
    client = app.test_client()

    def post(n: int, org: str = ORG_A, **headers: str) -> Any:
        return client.post("/bulk", json={"items": list(range(n))}, headers={"X-Org": org, **headers})

    def remaining(org: str = ORG_A) -> int:
        return limit.shared.get_window_stats(limit.items[0], KEY_PREFIX, f"org:{org}", "bulk").remaining

    assert post(4).status_code == 202 and remaining() == 6
    assert post(5).status_code == 202 and remaining() == 1
    # Three would overflow the window: refused with Retry-After; only the request itself (one,
    # counted before the route read its items) is used, not the three it carried.
    refused = post(3)
    assert refused.status_code == 429 and json_of(refused)["error"]["code"] == "rate_limited"
    assert 0 < int(refused.headers["Retry-After"]) <= 61
    assert remaining() == 0
    # More items than one window allows could never pass: 413, whatever is left.
    too_many = post(11, org="org-big")
    assert too_many.status_code == 413
    assert json_of(too_many)["error"]["details"] == {"items": 11, "limit": "10 per 1 minute"}
    assert remaining("org-big") == 9  # the request itself, and nothing for its items
    # System identities are not counted, however many items they carry.
    assert post(50, org="ops", **{"X-System": "1"}).status_code == 202


def test_count_items_does_nothing_with_the_limit_disabled(tmp_path: Path) -> None:
    app, _limit = bulk_app(make_settings(tmp_path, rate_limit_writes="10/minute"))
    off = Flask("off")
    assert install_rate_limit(off, make_settings(tmp_path, rate_limit_writes="disabled")) is None
    with off.test_request_context("/bulk", method="POST"):
        count_items(1000)  # no limit installed: nothing to count, nothing raised
    assert (
        app.test_client().post("/bulk", json={"items": [1] * 10}, headers={"X-Org": ORG_A}).status_code == 202
    )
