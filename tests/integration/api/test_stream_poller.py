"""The shared event-stream poller: one query per tick for every open stream.

Real Postgres (and SQLite where the subject is not the database), real server threads for the
HTTP case: followers wait for the poller in the server's own threads, as under gunicorn.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests
from sqlalchemy import event
from sqlalchemy.engine import Engine
from werkzeug.serving import make_server

from api.watch import StreamPoller, Subscription
from app.jobs.vocab import job_stream
from app.storage import tokens
from tests.support.api import Api, build_api, key, make_settings

WAIT_S = 10.0


def _until(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def _wait_woken(sub: Subscription) -> None:
    deadline = time.monotonic() + WAIT_S
    while sub.wakes == 0:
        assert time.monotonic() < deadline, "the subscriber was never woken"
        sub.wait(0.05)


class StatementCounter:
    """Counts the SQL statements an engine runs (every connection, every thread)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.count = 0
        self._lock = threading.Lock()
        event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, *_: Any) -> None:
        with self._lock:
            self.count += 1

    def close(self) -> None:
        event.remove(self.engine, "before_cursor_execute", self._seen)


def test_a_subscriber_is_woken_only_when_its_stream_advances(pg_engine: Engine, tmp_path: Any) -> None:
    api = build_api(pg_engine, make_settings(tmp_path))
    a, b = key(api.job()), key(api.job())
    poller = StreamPoller(pg_engine, poll_ms=10)
    sub_a = poller.subscribe({job_stream(a): 1}, None)
    sub_b = poller.subscribe({job_stream(b): 1}, None)
    try:
        ticks = poller.ticks
        _until(lambda: poller.ticks >= ticks + 3, "three idle ticks")
        assert sub_a.wakes == sub_b.wakes == 0  # nothing advanced: nobody woken
        api.lease_and_start(a)  # seq 2 (leased) and 3 (heartbeat) on a's stream only
        _wait_woken(sub_a)
        # A tick may land between the two appends; the next one reports the head.
        _until(lambda: sub_a.advanced() == {job_stream(a): 3}, "a's head to be 3")
        ticks = poller.ticks
        _until(lambda: poller.ticks >= ticks + 3, "three more ticks")
        assert sub_b.wakes == 0 and sub_b.advanced() == {}
        sub_a.read_up_to(job_stream(a), 3)  # the follower read them
        assert sub_a.advanced() == {}
    finally:
        sub_a.close()
        sub_b.close()
    # With no subscriber the poller's thread ends: an idle process runs no query at all.
    _until(lambda: not poller._running, "the poller to stop")


def test_a_revoked_token_wakes_its_subscribers_and_no_other(pg_engine: Engine, tmp_path: Any) -> None:
    api = build_api(pg_engine, make_settings(tmp_path))
    job = key(api.job())
    with pg_engine.connect() as conn:
        ids = {who: tokens.authenticate(conn, api.secrets[who]) for who in ("a", "b")}
    poller = StreamPoller(pg_engine, poll_ms=10)
    sub_a = poller.subscribe({job_stream(job): 1}, ids["a"].id)  # type: ignore[union-attr]
    sub_b = poller.subscribe({job_stream(job): 1}, ids["b"].id)  # type: ignore[union-attr]
    try:
        assert tokens.revoke(pg_engine, api.secrets["a"])
        _wait_woken(sub_a)
        assert sub_a.revoked
        assert not sub_b.revoked and sub_b.wakes == 0
    finally:
        sub_a.close()
        sub_b.close()


@pytest.fixture
def served(pg_engine: Engine, tmp_path: Any) -> Iterator[tuple[str, Api]]:
    api = build_api(
        pg_engine, make_settings(tmp_path, sse_poll_ms=50, sse_max_seconds=60, sse_max_streams_per_token=200)
    )
    server = make_server("127.0.0.1", 0, api.app, threaded=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", api
    finally:
        server.shutdown()
        thread.join(timeout=10)
        server.server_close()


def test_many_open_streams_cost_one_query_per_tick(served: tuple[str, Api]) -> None:
    base, api = served
    jobs = [api.job() for _ in range(40)]
    session = requests.Session()
    responses = []
    try:
        for job in jobs:
            r = session.get(
                f"{base}/jobs/{job['id']}/events", headers=api.headers(), stream=True, timeout=WAIT_S
            )
            assert r.status_code == 200
            responses.append(r)
        lines = [r.iter_lines() for r in responses]
        for it in lines:  # every follower has sent its first event, so it is subscribed and idle
            while not next(it).startswith(b"data:"):
                pass
        poller = api.state.poller
        _until(lambda: poller.subscribers == len(jobs), "every follower to subscribe")
        counter = StatementCounter(api.engine)
        try:
            ticks = poller.ticks
            # The thing measured: what 40 idle streams cost over at least ten ticks (about 0.1 s at
            # this poll, longer on a machine busy with other tests: counted in ticks, not seconds).
            _until(lambda: poller.ticks - ticks >= 10, "ten ticks of the poller")
            statements, ticked = counter.count, poller.ticks - ticks
        finally:
            counter.close()
        assert ticked >= 10
        # One statement per tick, whatever the number of streams (the old followers ran two per
        # stream per poll: here 80 per tick). A tick in flight at either edge may add one.
        assert statements <= ticked + 1, (statements, ticked)

        # One stream advancing wakes that follower only; it reads its receipts and sends them.
        api.lease_and_start(key(jobs[7]))
        it = lines[7]
        got: list[int] = []
        while len(got) < 2:
            line = next(it)
            if line.startswith(b"id:"):
                got.append(int(line.split(b":")[1]))
        assert got == [2, 3]
    finally:
        for r in responses:
            r.close()
