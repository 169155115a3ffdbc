"""Durable, signed callbacks across real processes.

A receiver in the test process stands in for the callback target. The sender runs in the
maintenance consumers (driver, control) on beat ticks and their local tickers, never in the
worker that settled the job, so a worker killed after settling loses nothing.
"""

from __future__ import annotations

import json
import queue as queue_module
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from sqlalchemy import select
from standardwebhooks.webhooks import Webhook

from app.storage.db import callback_outbox
from devharness import handlers
from tests.support.stack import Stack
from tests.support.waiting import free_port, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e")]

SECRET = "whsec_" + "ZTJlLWNhbGxiYWNrLXNlY3JldA=="


class Receiver:
    """A callback target on a fixed port that can be started late and verifies every signature."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.url = f"http://127.0.0.1:{port}/hook"
        self.got: queue_module.Queue[tuple[dict[str, str], dict[str, Any]]] = queue_module.Queue()
        self.server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                headers = {k.lower(): v for k, v in self.headers.items()}
                body = Webhook(SECRET).verify(raw, headers)  # raises (-> 500) on a bad signature
                receiver.got.put((headers, body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *_args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()

    def stop(self) -> None:
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()

    def drain(self) -> list[tuple[dict[str, str], dict[str, Any]]]:
        out = []
        while not self.got.empty():
            out.append(self.got.get_nowait())
        return out


@pytest.fixture
def receiver(stack: Stack) -> Iterator[Receiver]:
    r = Receiver(free_port())
    stack.env_overrides.update(
        RECEIPT_RESONATE_CALLBACK_URL=r.url,
        RECEIPT_CALLBACK_SECRET=SECRET,
        RECEIPT_CALLBACK_SEND_INTERVAL_MS="250",
        RECEIPT_CALLBACK_RETRY_BASE_MS="200",
        RECEIPT_CALLBACK_RETRY_MAX_MS="2000",
    )
    yield r
    r.stop()


def _outbox(stack: Stack) -> list[Any]:
    with stack.engine.connect() as conn:
        return list(conn.execute(select(callback_outbox).order_by(callback_outbox.c.id)).all())


RETRIES_WHILE_DOWN = 3


def test_a_target_down_through_several_retries_then_up_gets_every_event_with_stable_ids(
    stack: Stack, receiver: Receiver
) -> None:
    stack.start("web", "driver", "chat", "beat")
    ids = [stack.post_job(handlers.ECHO, message=f"m{n}")["id"] for n in range(5)]
    for job_id in ids:
        assert stack.wait_terminal(job_id, timeout=30).status == "completed"

    # The outage lasts until each job's first event has been tried and refused several times (a
    # job's later events wait behind its first: delivery is in order per job).
    def retried_while_down() -> bool:
        rows = _outbox(stack)
        tried = {r.job_id for r in rows if r.attempts >= RETRIES_WHILE_DOWN}
        return len(rows) == 10 and len(tried) == len(ids)

    wait_for(
        retried_while_down,
        90,
        what=f"each job's first event tried {RETRIES_WHILE_DOWN} times while the target is down",
    )
    before = {r.event_id: r.attempts for r in _outbox(stack)}
    assert all(r.state != "delivered" for r in _outbox(stack))
    receiver.start()
    seen: dict[str, dict[str, Any]] = {}

    def all_seen() -> bool:
        for headers, body in receiver.drain():
            assert headers["webhook-id"] == body["eventId"]
            seen[body["eventId"]] = body
        return len(seen) == 10

    wait_for(all_seen, 60, what="every event delivered after the target came back")
    assert set(seen) == set(before)  # the ids written with the receipts, unchanged by retries
    for job_id in ids:
        assert sorted(b["event"] for b in seen.values() if b["jobId"] == job_id) == [
            "completed",
            "dispatched",
        ]
    wait_for(lambda: all(r.state == "delivered" for r in _outbox(stack)), 20, what="every row delivered")


def test_a_worker_sigkilled_right_after_settling_still_gets_completed_delivered(
    stack: Stack, receiver: Receiver
) -> None:
    receiver.start()
    stack.start("web", "driver", "chat", "beat")
    job_id = stack.post_job(handlers.ECHO, message="settle then die")["id"]
    stack.wait_terminal(job_id, timeout=30)
    stack.harness.kill(stack.procs.pop("chat"))  # the process that wrote the terminal receipt
    events: list[str] = []

    def completed() -> bool:
        events.extend(b["event"] for _, b in receiver.drain() if b["jobId"] == job_id)
        return "completed" in events

    wait_for(completed, 30, what="the completed callback")
    assert events.count("completed") >= 1


def test_an_api_side_cancel_of_a_queued_job_sends_canceled(stack: Stack, receiver: Receiver) -> None:
    receiver.start()
    stack.start("web", "driver", "beat")  # no chat worker: the job stays queued
    job_id = stack.post_job(handlers.ECHO, message="never runs")["id"]
    stack.cancel(job_id, "changed my mind")
    bodies: list[dict[str, Any]] = []

    def canceled() -> bool:
        bodies.extend(b for _, b in receiver.drain() if b["jobId"] == job_id)
        return any(b["event"] == "canceled" for b in bodies)

    wait_for(canceled, 30, what="the canceled callback")
    [body] = [b for b in bodies if b["event"] == "canceled"]
    assert body["status"] == "canceled"
    assert json.loads(json.dumps(body)) == body
