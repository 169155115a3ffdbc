"""Delivery callbacks (spec step 6, "Callback"): JSON POSTs that never delay or fail a settlement.

A real HTTP server on 127.0.0.1 receives them. "Slow" is a handler blocked on an Event, so the
assertions are about ordering (post returned while the target still holds the request), not timing.
"""

from __future__ import annotations

import json
import logging
import queue as queue_module
import threading
from collections.abc import Iterator
from concurrent.futures import wait
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from app.config import Settings
from app.jobs.reducer import Job
from app.storage.queue import Queue
from tasks.callbacks import CALLBACK_EVENTS, CALLBACK_TIMEOUT_S, Callbacks
from tasks.execute import execute
from tasks.runtime import Runtime
from tests.support.waiting import free_port
from workers.handler import JobContext

from .runtime_support import enqueue, registry_of

WAIT_S = 10.0


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class Target:
    """A callback receiver. ``hold`` makes every request wait until released (a slow target)."""

    url: str
    received: queue_module.Queue[Received] = field(default_factory=queue_module.Queue)
    hold: threading.Event | None = None
    entered: threading.Event = field(default_factory=threading.Event)

    def next(self) -> Received:
        return self.received.get(timeout=WAIT_S)


def _serve(path: str, hold: threading.Event | None = None) -> tuple[ThreadingHTTPServer, Target]:
    target = Target(url="", hold=hold)

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            target.entered.set()
            if target.hold is not None:
                target.hold.wait(WAIT_S * 2)
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length))
            target.received.put(Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *_args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    target.url = f"http://127.0.0.1:{server.server_address[1]}{path}"
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server, target


@pytest.fixture
def targets() -> Iterator[Any]:
    servers: list[tuple[ThreadingHTTPServer, Target]] = []

    def make(path: str = "/hook", hold: threading.Event | None = None) -> Target:
        server, target = _serve(path, hold)
        servers.append((server, target))
        return target

    yield make
    for server, target in servers:
        if target.hold is not None:
            target.hold.set()
        server.shutdown()
        server.server_close()


def settings(**env: str) -> Settings:
    return Settings.from_env(env)


def a_job(sqlite_engine: Engine) -> Job:
    return enqueue(Queue(sqlite_engine), "factory")


def test_every_event_reaches_both_urls_with_the_bearer_token(targets: Any, sqlite_engine: Engine) -> None:
    resonate, events = targets("/resonate"), targets("/events")
    cb = Callbacks(
        settings(
            RECEIPT_RESONATE_CALLBACK_URL=resonate.url,
            RECEIPT_EVENT_CALLBACK_URL=events.url,
            RECEIPT_CALLBACK_TOKEN="cb-secret",
        )
    )
    job = a_job(sqlite_engine)
    for event in ("dispatched", "completed", "failed", "canceled"):
        futures = cb.post(event, job)
        assert len(futures) == 2
        for target, path in ((resonate, "/resonate"), (events, "/events")):
            got = target.next()
            assert got.path == path
            assert got.headers["authorization"] == "Bearer cb-secret"
            assert got.headers["content-type"] == "application/json"
            assert got.body["event"] == event
            assert got.body["jobId"] == job.id
            assert got.body["agentId"] == "factory"
            assert got.body["status"] == job.status
            assert got.body["stream"] == f"jobs/{job.id}"


def test_only_the_four_spec_events_are_posted(targets: Any, sqlite_engine: Engine) -> None:
    assert CALLBACK_EVENTS == ("dispatched", "completed", "failed", "canceled")
    target = targets()
    cb = Callbacks(settings(RECEIPT_RESONATE_CALLBACK_URL=target.url))
    assert cb.post("progress", a_job(sqlite_engine)) == []
    assert cb.post("leased", a_job(sqlite_engine)) == []
    assert target.received.empty()


def test_no_token_means_no_authorization_header(targets: Any, sqlite_engine: Engine) -> None:
    target = targets()
    cb = Callbacks(settings(RECEIPT_EVENT_CALLBACK_URL=target.url))
    cb.post("completed", a_job(sqlite_engine))
    assert "authorization" not in target.next().headers


def test_no_urls_configured_posts_nothing() -> None:
    cb = Callbacks(settings())
    assert cb.urls == []
    assert cb._pool is None


def test_a_slow_target_does_not_delay_post(targets: Any, sqlite_engine: Engine) -> None:
    release = threading.Event()
    slow = targets(hold=release)
    cb = Callbacks(settings(RECEIPT_RESONATE_CALLBACK_URL=slow.url))
    futures = cb.post("completed", a_job(sqlite_engine))
    # post() has returned; the target is only now (or later) holding the request.
    assert slow.entered.wait(WAIT_S)
    assert not release.is_set()
    assert slow.received.empty()
    assert not any(f.done() for f in futures)
    release.set()
    assert slow.next().body["event"] == "completed"
    wait(futures, timeout=WAIT_S)
    assert all(f.done() and f.exception() is None for f in futures)


def test_the_request_timeout_is_five_seconds(monkeypatch: pytest.MonkeyPatch, sqlite_engine: Engine) -> None:
    seen: list[dict[str, Any]] = []

    class Response:
        status_code = 200

    def fake_post(url: str, **kwargs: Any) -> Response:
        seen.append({"url": url, **kwargs})
        return Response()

    monkeypatch.setattr("tasks.callbacks.requests.post", fake_post)
    cb = Callbacks(settings(RECEIPT_RESONATE_CALLBACK_URL="http://127.0.0.1:9/x"))
    wait(cb.post("failed", a_job(sqlite_engine)), timeout=WAIT_S)
    assert CALLBACK_TIMEOUT_S == 5.0
    assert [s["timeout"] for s in seen] == [5.0]


def test_an_unreachable_url_only_logs(caplog: pytest.LogCaptureFixture, sqlite_engine: Engine) -> None:
    dead = f"http://127.0.0.1:{free_port()}/gone"
    cb = Callbacks(settings(RECEIPT_RESONATE_CALLBACK_URL=dead))
    job = a_job(sqlite_engine)
    with caplog.at_level(logging.WARNING, logger="receipt.callbacks"):
        futures = cb.post("failed", job)
        wait(futures, timeout=WAIT_S)
    assert all(f.exception() is None for f in futures)
    messages = [r.getMessage() for r in caplog.records if r.name == "receipt.callbacks"]
    assert any("failed" in m and job.id in m for m in messages)


def test_an_error_status_only_logs(caplog: pytest.LogCaptureFixture, sqlite_engine: Engine) -> None:
    server, target = _serve("/hook")

    class Failing(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            self.send_response(500)
            self.end_headers()

        def log_message(self, *_args: Any) -> None:
            pass

    server.RequestHandlerClass = Failing
    try:
        cb = Callbacks(settings(RECEIPT_RESONATE_CALLBACK_URL=target.url))
        with caplog.at_level(logging.WARNING, logger="receipt.callbacks"):
            wait(cb.post("completed", a_job(sqlite_engine)), timeout=WAIT_S)
        assert any("500" in r.getMessage() for r in caplog.records if r.name == "receipt.callbacks")
    finally:
        server.shutdown()
        server.server_close()


def test_a_slow_target_never_delays_a_settlement(targets: Any, sqlite_engine: Engine, redis_url: str) -> None:
    """The worker task settles and returns while the callback target is still holding the POST."""
    from tasks.celery_app import make_celery

    release = threading.Event()
    slow = targets(hold=release)
    s = settings(RECEIPT_RESONATE_CALLBACK_URL=slow.url, REDIS_URL=redis_url, JOB_LEASE_MS="3000")
    queue = Queue(sqlite_engine)

    def noop(ctx: JobContext) -> Any:
        return {"done": True}

    rt = Runtime(s, make_celery(s), sqlite_engine, queue, registry_of({"factory": noop}), Callbacks(s))
    job = enqueue(queue, "factory")
    fence = f"{job.id}:attempt:1"
    out = execute(rt, job.id, fence, job.id, 0)
    assert out["status"] == "completed"
    settled = queue.get(job.id)
    assert settled is not None and settled.status == "completed"
    assert slow.entered.wait(WAIT_S)
    assert slow.received.empty()  # the POST is still being held by the target
    release.set()
    got = slow.next()
    assert (got.body["event"], got.body["status"], got.body["result"]) == (
        "completed",
        "completed",
        {"done": True},
    )
