"""GET /streams/<stream>/receipts and the two Server-Sent Event endpoints."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from tests.support.api import ORG_A, WORKER, Api, json_of, key
from tests.support.queue_ops import complete

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone


def _drive_to_completion(api: Api, job_id: str) -> None:
    attempt = api.lease_and_start(job_id)
    api.queue.progress(job_id, WORKER, attempt, {"step": 1})
    complete(api.queue, job_id, WORKER, attempt, {"answer": 42})


# -- raw receipts -------------------------------------------------------------------------------


def test_receipts_of_a_job_stream(api: Api) -> None:
    job = api.job()
    _drive_to_completion(api, key(job))
    response = api.client.get(f"/streams/{job['stream']}/receipts", headers=api.headers())
    assert response.status_code == 200
    body = response.json
    assert body is not None
    assert body["stream"] == job["stream"] == f"jobs/{ORG_A}/{job['id']}"
    assert body["nextAfter"] is None
    rows = body["receipts"]
    assert [r["type"] for r in rows] == [
        "job.enqueued",
        "job.leased",
        "job.heartbeat",
        "job.progress",
        "job.completed",
    ]
    assert [r["seq"] for r in rows] == [1, 2, 3, 4, 5]
    assert set(rows[0]) == {"id", "stream", "seq", "type", "body", "at", "prevHash", "hash"}
    assert rows[0]["prevHash"] is None
    assert all(r["prevHash"] == prev["hash"] for prev, r in itertools.pairwise(rows))


def test_receipts_after_and_limit_page_through(api: Api) -> None:
    job = api.job()
    _drive_to_completion(api, key(job))
    url = f"/streams/{job['stream']}/receipts"
    first = api.client.get(url, query_string={"limit": 2}, headers=api.headers()).json
    assert first is not None
    assert [r["seq"] for r in first["receipts"]] == [1, 2]
    assert first["nextAfter"] == 2
    second = json_of(api.client.get(url, query_string={"after": 2, "limit": 2}, headers=api.headers()))
    assert [r["seq"] for r in second["receipts"]] == [3, 4]
    last = json_of(api.client.get(url, query_string={"after": 4, "limit": 2}, headers=api.headers()))
    assert [r["seq"] for r in last["receipts"]] == [5]
    assert last["nextAfter"] is None


def test_receipts_bad_parameters_are_400(sqlite_api: Api) -> None:
    job = sqlite_api.job()
    url = f"/streams/{job['stream']}/receipts"
    for query, field in (
        ({"after": "-1"}, "after"),
        ({"after": "x"}, "after"),
        ({"limit": "0"}, "limit"),
        ({"after": str(2**40)}, "after"),
    ):
        response = sqlite_api.client.get(url, query_string=query, headers=sqlite_api.headers())
        assert response.status_code == 400, query
        assert json_of(response)["error"]["details"]["field"] == field


def test_unknown_streams_are_404(api: Api) -> None:
    for stream in ("jobs/nope", "other/thing", "jobs/"):
        for who in ("a", "system"):
            response = api.client.get(f"/streams/{stream}/receipts", headers=api.headers(who))
            assert response.status_code == 404, (stream, who)


def test_token_streams_are_system_only(api: Api) -> None:
    with api.engine.connect() as conn:
        from app.storage.store import streams

        token_stream = streams(conn, "tokens/")[0]
    assert api.client.get(f"/streams/{token_stream}/receipts", headers=api.headers("a")).status_code == 404
    assert api.client.get(f"/streams/{token_stream}/events", headers=api.headers("a")).status_code == 404
    response = api.client.get(f"/streams/{token_stream}/receipts", headers=api.headers("system"))
    assert response.status_code == 200
    assert json_of(response)["receipts"][0]["type"] == "token.created"


# -- job events ------------------------------------------------------------------------------------


def _statuses(frames: list[Any]) -> list[tuple[int, str]]:
    return [(f.id, f.data["status"]) for f in frames]


def test_job_events_emit_every_state_and_end_at_terminal(api: Api, open_events: Any) -> None:
    job = api.job()
    reader = open_events(api.client, f"/jobs/{job['id']}/events", api.headers())
    first = reader.next_event()
    assert (first.id, first.event, first.data["status"]) == (1, "job", "queued")
    assert first.data["route"]["queue"] == "receipt-chat"
    # The server runs lazily: these changes land while the stream is open.
    _drive_to_completion(api, key(job))
    rest = reader.rest()
    assert _statuses(rest) == [(2, "leased"), (3, "running"), (4, "running"), (5, "completed")]
    assert rest[2].data["progress"] == {"step": 1}
    assert rest[-1].data["result"] == {"answer": 42}
    assert reader.ended


def test_job_events_resume_with_last_event_id_misses_nothing(api: Api, open_events: Any) -> None:
    job = api.job()
    reader = open_events(api.client, f"/jobs/{job['id']}/events", api.headers())
    seen = [reader.next_event()]
    attempt = api.lease_and_start(key(job))
    seen.append(reader.next_event())
    reader.close()  # the client drops after event 2 (leased)
    api.queue.progress(key(job), WORKER, attempt, {"step": 1})
    complete(api.queue, key(job), WORKER, attempt, "done")
    resumed = open_events(
        api.client, f"/jobs/{job['id']}/events", api.headers(**{"Last-Event-ID": str(seen[-1].id)})
    )
    seen += resumed.rest()
    assert [f.id for f in seen] == [1, 2, 3, 4, 5]
    assert _statuses(seen)[-1] == (5, "completed")
    # ?after= works the same for clients that cannot set headers.
    by_query = open_events(api.client, f"/jobs/{job['id']}/events?after=3", api.headers())
    assert [f.id for f in by_query.rest()] == [4, 5]


def test_job_events_of_a_finished_job_replay_then_end(api: Api, open_events: Any) -> None:
    job = api.job()
    api.client.post(f"/jobs/{job['id']}/cancel", headers=api.headers())
    reader = open_events(api.client, f"/jobs/{job['id']}/events", api.headers())
    assert _statuses(reader.rest()) == [(1, "queued"), (2, "canceled")]
    caught_up = open_events(api.client, f"/jobs/{job['id']}/events", api.headers(**{"Last-Event-ID": "2"}))
    assert caught_up.rest() == []


def test_job_events_end_after_max_seconds_with_heartbeats(sqlite_api: Api, open_events: Any) -> None:
    sqlite_api.state.sse_heartbeat_seconds = 0.02
    sqlite_api.app.extensions["receipt"].settings = _with(sqlite_api, sse_max_seconds=0)
    job = sqlite_api.job()
    reader = open_events(sqlite_api.client, f"/jobs/{job['id']}/events", sqlite_api.headers())
    frames = []
    while (frame := reader.next_frame()) is not None:
        frames.append(frame)
    assert frames[0].retry is not None
    assert [f.id for f in frames if f.event] == [1]
    assert reader.ended  # a live job's stream still ends when its time is up


def test_heartbeat_comments_are_sent_while_idle(sqlite_api: Api, open_events: Any) -> None:
    sqlite_api.state.sse_heartbeat_seconds = 0.01
    sqlite_api.app.extensions["receipt"].settings = _with(sqlite_api, sse_max_seconds=1)
    job = sqlite_api.job()
    reader = open_events(sqlite_api.client, f"/jobs/{job['id']}/events", sqlite_api.headers())
    assert reader.next_event().id == 1
    frame = reader.next_frame()
    while frame is not None and frame.comment is None:
        frame = reader.next_frame()
    assert frame is not None and frame.comment == "heartbeat"


def test_bad_last_event_id_is_400(sqlite_api: Api) -> None:
    job = sqlite_api.job()
    for value in ("abc", "-1", "99999999999"):
        response = sqlite_api.client.get(
            f"/jobs/{job['id']}/events", headers=sqlite_api.headers(**{"Last-Event-ID": value})
        )
        assert response.status_code == 400, value
        assert json_of(response)["error"]["details"]["field"] == "Last-Event-ID"


def _with(api: Api, **changes: Any) -> Any:
    from dataclasses import replace

    return replace(api.state.settings, **changes)


# -- raw receipt events ----------------------------------------------------------------------------


def test_stream_events_emit_raw_receipts_and_resume(api: Api, open_events: Any) -> None:
    job = api.job()
    url = f"/streams/{job['stream']}/events"
    reader = open_events(api.client, url, api.headers())
    first = reader.next_event()
    assert (first.id, first.event, first.data["type"]) == (1, "receipt", "job.enqueued")
    attempt = api.lease_and_start(key(job))
    assert [reader.next_event().data["type"] for _ in range(2)] == ["job.leased", "job.heartbeat"]
    reader.close()
    complete(api.queue, key(job), WORKER, attempt, None)
    resumed = open_events(api.client, url, api.headers(**{"Last-Event-ID": "3"}))
    rest = resumed.rest()
    assert [(f.id, f.data["type"]) for f in rest] == [(4, "job.completed")]
    assert set(rest[0].data) == {"id", "stream", "seq", "type", "body", "at", "prevHash", "hash"}


def test_system_may_follow_any_stream(sqlite_api: Api, open_events: Any) -> None:
    sqlite_api.app.extensions["receipt"].settings = _with(sqlite_api, sse_max_seconds=0)
    with sqlite_api.engine.connect() as conn:
        from app.storage.store import streams

        token_stream = streams(conn, "tokens/")[0]
    reader = open_events(sqlite_api.client, f"/streams/{token_stream}/events", sqlite_api.headers("system"))
    assert [f.data["type"] for f in reader.rest()] == ["token.created"]


def test_a_storage_failure_mid_stream_ends_it_cleanly(
    sqlite_api: Api, open_events: Any, monkeypatch: Any
) -> None:
    from app.storage import heads

    job = sqlite_api.job()
    reader = open_events(sqlite_api.client, f"/jobs/{job['id']}/events", sqlite_api.headers())
    assert reader.next_event().id == 1

    def unavailable(*_: Any, **__: Any) -> Any:
        raise OSError("the database went away")

    # The process's shared poller reads the heads of every open stream: that read fails.
    monkeypatch.setattr(heads, "read", unavailable)
    frames = []
    while (frame := reader.next_frame()) is not None:
        frames.append(frame)
        assert len(frames) < 50
    assert frames[-1].comment == "storage unavailable, reconnect"
    assert reader.ended


def test_a_failed_read_after_a_wake_up_ends_the_stream_cleanly(sqlite_api: Api, open_events: Any) -> None:
    from app.storage.db import make_engine

    job = sqlite_api.job()
    reader = open_events(sqlite_api.client, f"/jobs/{job['id']}/events", sqlite_api.headers())
    assert reader.next_event().id == 1
    broken = make_engine("postgresql+psycopg2://nobody@127.0.0.1:1/none")
    # The follower captured the engine when the stream opened; break that engine's pool, then
    # move the stream so the poller (on its own connection) wakes the follower to read.
    original_connect = sqlite_api.engine.connect
    sqlite_api.lease_and_start(key(job))
    sqlite_api.engine.connect = broken.connect  # type: ignore[method-assign]
    try:
        frames = []
        while (frame := reader.next_frame()) is not None:
            frames.append(frame)
    finally:
        sqlite_api.engine.connect = original_connect  # type: ignore[method-assign]
        broken.dispose()
    assert frames[-1].comment == "storage unavailable, reconnect"
    assert reader.ended
