"""Durable, signed callbacks (spec step 6): an outbox written with the receipt,
a sender that delivers at least once, in order per job, signed with Standard Webhooks headers.

A real HTTP server on 127.0.0.1 receives them. "Slow" is a handler blocked on an Event, so the
assertions are about ordering (the settlement returned while the target still holds nothing), not timing.
"""

from __future__ import annotations

import json
import queue as queue_module
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from app.composition import queue_for
from app.config import Settings
from app.storage import outbox, store
from app.storage.db import callback_outbox
from delivery.callbacks import CALLBACK_EVENTS, CALLBACK_TIMEOUT_S, Callbacks, Sender, send_due
from delivery.client import DeliveryClient
from tests.support import queue_ops
from tests.support.queue_ops import lease
from tests.support.tracing import Spans
from tests.support.waiting import free_port
from workers.attempts import execute
from workers.handler import JobContext
from workers.runner import AttemptResult, run_attempt
from workers.runtime import Runtime

from .runtime_support import enqueue, registry_of, wait_until

WAIT_S = 10.0


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]
    raw: bytes = b""


@dataclass
class Target:
    """A callback receiver. ``hold`` makes every request wait until released (a slow target)."""

    url: str
    received: queue_module.Queue[Received] = field(default_factory=queue_module.Queue)
    hold: threading.Event | None = None
    entered: threading.Event = field(default_factory=threading.Event)
    status: int = 204
    location: str | None = None

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
            raw = self.rfile.read(length)
            headers = {k.lower(): v for k, v in self.headers.items()}
            target.received.put(Received(self.path, headers, json.loads(raw), raw))
            self.send_response(target.status)
            if target.location:
                self.send_header("Location", target.location)
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


def outbox_rows(engine: Engine, job_id: str | None = None) -> list[Any]:
    q = select(callback_outbox).order_by(callback_outbox.c.id)
    if job_id is not None:
        q = q.where(callback_outbox.c.job_id == job_id)
    with engine.connect() as conn:
        return list(conn.execute(q).all())


def fast(**env: str) -> Settings:
    return settings(RECEIPT_CALLBACK_RETRY_BASE_MS="50", RECEIPT_CALLBACK_RETRY_MAX_MS="200", **env)


def test_the_four_spec_events_are_the_outbox_events() -> None:
    assert CALLBACK_EVENTS == ("dispatched", "completed", "failed", "canceled")
    assert CALLBACK_TIMEOUT_S == 5.0


def test_a_terminal_receipt_writes_one_row_per_target_in_its_own_transaction(sqlite_engine: Engine) -> None:
    q = queue_for(sqlite_engine, callback_targets=("http://a.invalid/1", "http://b.invalid/2"))
    job = enqueue(q, "factory")
    assert outbox_rows(sqlite_engine) == []  # enqueue and lease are no callback events
    assert lease(q, job.id, "w", 60_000, start=True).applied
    done = queue_ops.complete(q, job.id, "w", 1, {"ok": True}).job
    rows = outbox_rows(sqlite_engine, job.id)
    assert [(r.target, r.event, r.seq, r.state) for r in rows] == [
        ("http://a.invalid/1", "completed", done.seq, "pending"),
        ("http://b.invalid/2", "completed", done.seq, "pending"),
    ]
    assert rows[0].event_id == rows[1].event_id == outbox.event_id(job.id, "completed", str(done.seq))
    assert json.loads(rows[0].body)["eventId"] == rows[0].event_id
    # A cancel of a queued job (what the API does) writes its "canceled" the same way.
    other = enqueue(q, "factory")
    q.cancel(other.id, "no longer needed")
    assert [r.event for r in outbox_rows(sqlite_engine, other.id)] == ["canceled", "canceled"]


def test_no_targets_means_no_rows(sqlite_engine: Engine) -> None:
    q = queue_for(sqlite_engine)
    job = enqueue(q, "factory")
    q.cancel(job.id)
    assert outbox_rows(sqlite_engine) == []


def test_sent_with_the_bearer_token_and_a_signature_the_receiver_verifies(
    targets: Any, sqlite_engine: Engine
) -> None:
    target = targets()
    secret = "whsec_" + "c2VjcmV0LWZvci10ZXN0cw=="  # base64 of "secret-for-tests"
    s = settings(
        RECEIPT_RESONATE_CALLBACK_URL=target.url,
        RECEIPT_CALLBACK_TOKEN="cb-token",
        RECEIPT_CALLBACK_SECRET=secret,
    )
    q = queue_for(sqlite_engine, callback_targets=s.callback_targets)
    job = enqueue(q, "factory")
    q.cancel(job.id, "stop")
    assert send_due(sqlite_engine, Sender(s)) == {"delivered": 1, "failed": 0}
    got = target.next()
    assert got.headers["authorization"] == "Bearer cb-token"
    assert got.headers["content-type"] == "application/json"
    assert got.headers["webhook-id"] == got.body["eventId"]
    # The receiver's side, with the standard's own library: the signature verifies ...
    verified = Webhook(secret).verify(got.raw, got.headers)
    assert (verified["event"], verified["jobId"], verified["status"]) == (
        "canceled",
        job.client_id,
        "canceled",
    )
    # The client's id is unique within its organisation: the body names both, and the qualified stream.
    assert (verified["organizationId"], verified["stream"]) == (job.organization_id, job.stream)
    assert (
        job.organization_id is not None
        and verified["stream"] == f"jobs/{job.organization_id}/{job.client_id}"
    )
    # ... and would not with another secret, or with a body changed in transit.
    with pytest.raises(WebhookVerificationError):
        Webhook("whsec_" + "b3RoZXItc2VjcmV0").verify(got.raw, got.headers)
    with pytest.raises(WebhookVerificationError):
        Webhook(secret).verify(got.raw.replace(b"canceled", b"completed"), got.headers)
    assert [r.state for r in outbox_rows(sqlite_engine)] == ["delivered"]


def test_a_plain_secret_signs_with_its_raw_bytes(targets: Any, sqlite_engine: Engine) -> None:
    target = targets()
    s = settings(RECEIPT_RESONATE_CALLBACK_URL=target.url, RECEIPT_CALLBACK_SECRET="plain text secret")
    q = queue_for(sqlite_engine, callback_targets=s.callback_targets)
    q.cancel(enqueue(q, "factory").id)
    send_due(sqlite_engine, Sender(s))
    got = target.next()
    assert Webhook(b"plain text secret").verify(got.raw, got.headers)["event"] == "canceled"


def test_redirects_are_not_followed(targets: Any, sqlite_engine: Engine) -> None:
    elsewhere = targets("/elsewhere")
    redirecting = targets("/hook")
    redirecting.status, redirecting.location = 307, elsewhere.url
    s = fast(RECEIPT_RESONATE_CALLBACK_URL=redirecting.url)
    q = queue_for(sqlite_engine, callback_targets=s.callback_targets)
    q.cancel(enqueue(q, "factory").id)
    assert send_due(sqlite_engine, Sender(s)) == {"delivered": 0, "failed": 1}
    redirecting.next()
    assert elsewhere.received.empty()
    [row] = outbox_rows(sqlite_engine)
    assert (row.state, row.attempts) == ("pending", 1)
    assert "redirects are not followed" in row.last_error


def test_a_target_down_then_up_gets_every_event_once_with_the_same_ids(
    targets: Any, sqlite_engine: Engine
) -> None:
    port = free_port()
    down_url = f"http://127.0.0.1:{port}/hook"
    s = fast(RECEIPT_RESONATE_CALLBACK_URL=down_url)
    q = queue_for(sqlite_engine, callback_targets=s.callback_targets)
    ids = [enqueue(q, "factory").id for _ in range(3)]
    for job_id in ids:
        q.cancel(job_id)
    expected = {r.event_id for r in outbox_rows(sqlite_engine)}
    sender = Sender(s)
    # Down: one connection attempt per pass for the whole target, never one per event.
    assert send_due(sqlite_engine, sender) == {"delivered": 0, "failed": 1}
    assert sorted(r.attempts for r in outbox_rows(sqlite_engine)) == [0, 0, 1]
    server, target = _serve("/hook")
    server.server_close()
    # Bring a receiver up on the very port that was down.
    from http.server import ThreadingHTTPServer

    up = ThreadingHTTPServer(("127.0.0.1", port), server.RequestHandlerClass)
    up.daemon_threads = True
    threading.Thread(target=up.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        wait_until(
            lambda: (
                send_due(sqlite_engine, sender) is not None
                and all(r.state == "delivered" for r in outbox_rows(sqlite_engine))
            ),
            what="every event delivered once the target is up",
        )
        got = [target.received.get(timeout=WAIT_S) for _ in expected]
        assert {g.headers["webhook-id"] for g in got} == {g.body["eventId"] for g in got} == expected
        assert target.received.empty()
    finally:
        up.shutdown()
        up.server_close()


def test_a_jobs_events_go_out_in_receipt_order_and_a_failing_head_holds_the_rest(
    targets: Any, sqlite_engine: Engine
) -> None:
    target = targets()
    target.status = 500
    s = fast(RECEIPT_RESONATE_CALLBACK_URL=target.url)
    q = queue_for(sqlite_engine, callback_targets=s.callback_targets)
    job = enqueue(q, "factory")
    callbacks = Callbacks(s)
    callbacks.dispatched(sqlite_engine, job, f"{job.id}:attempt:1")
    lease(q, job.id, "w", 60_000, start=True)
    queue_ops.complete(q, job.id, "w", 1, {})
    sender = Sender(s)
    send_due(sqlite_engine, sender)
    assert target.next().body["event"] == "dispatched"
    assert target.received.empty()  # "completed" waits behind the failing "dispatched"
    target.status = 204
    wait_until(
        lambda: (
            send_due(sqlite_engine, sender)["delivered"] == 0
            and all(r.state == "delivered" for r in outbox_rows(sqlite_engine))
        ),
        what="both delivered",
    )
    events = [target.next().body["event"] for _ in range(2)]
    assert events == ["dispatched", "completed"]


def test_an_event_failing_past_the_give_up_time_is_dead_lettered_and_listed(
    targets: Any, sqlite_engine: Engine, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    s = fast(
        RECEIPT_RESONATE_CALLBACK_URL=f"http://127.0.0.1:{free_port()}/x", RECEIPT_CALLBACK_GIVE_UP_MS="0"
    )
    q = queue_for(sqlite_engine, callback_targets=s.callback_targets)
    job = enqueue(q, "factory")
    q.cancel(job.id)
    send_due(sqlite_engine, Sender(s))
    [row] = outbox_rows(sqlite_engine)
    assert (row.state, row.attempts) == ("dead", 1)
    from app.ops import cli

    monkeypatch.setenv("DATABASE_URL", str(sqlite_engine.url))
    assert cli.main(["callbacks", "--state", "dead"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert listed["counts"] == {"dead": 1}
    assert [(r["job_id"], r["event"], r["state"]) for r in listed["rows"]] == [(job.id, "canceled", "dead")]


def test_a_failing_targets_secrets_reach_neither_the_outbox_nor_the_log_nor_the_cli(
    sqlite_engine: Engine,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The HTTP client's error names the URL it called, query string and all.
    port = free_port()
    url = f"http://hooks:pw-c4f1e@127.0.0.1:{port}/x?token=tok-c4f1e"
    s = fast(RECEIPT_RESONATE_CALLBACK_URL=url, RECEIPT_CALLBACK_GIVE_UP_MS="0")
    q = queue_for(sqlite_engine, callback_targets=s.callback_targets)
    q.cancel(enqueue(q, "factory").id)
    send_due(sqlite_engine, Sender(s))
    [row] = outbox_rows(sqlite_engine)
    assert row.state == "dead" and "Max retries exceeded with url: /x?***" in row.last_error
    assert "c4f1e" not in row.last_error
    assert caplog.records and "c4f1e" not in caplog.text
    from app.ops import cli

    monkeypatch.setenv("DATABASE_URL", str(sqlite_engine.url))
    monkeypatch.setenv("RECEIPT_RESONATE_CALLBACK_URL", url)
    with sqlite_engine.begin() as conn:  # a row an older sender wrote, quoting the URL
        conn.execute(callback_outbox.update().values(last_error=f"GET {url} failed"))
    assert cli.main(["callbacks"]) == 0
    printed = capsys.readouterr().out
    assert "c4f1e" not in printed
    [listed] = json.loads(printed)["rows"]
    assert listed["target"] == f"http://hooks:***@127.0.0.1:{port}/x?***"
    assert listed["last_error"] == f"GET http://hooks:***@127.0.0.1:{port}/x?*** failed"


def test_backoff_doubles_from_the_base_to_the_cap() -> None:
    assert [outbox.backoff_ms(n, 1000, 3_600_000) for n in (1, 2, 3, 4)] == [1000, 2000, 4000, 8000]
    assert outbox.backoff_ms(40, 1000, 3_600_000) == 3_600_000
    # The defaults keep trying for at least 24 h before a dead letter.
    defaults = Settings()
    assert defaults.callback_give_up_ms == 24 * 3600 * 1000


def test_each_attempt_has_a_five_second_timeout_and_no_redirects(
    monkeypatch: pytest.MonkeyPatch, sqlite_engine: Engine
) -> None:
    seen: dict[str, Any] = {}

    def fake_post(self: Any, url: str, **kwargs: Any) -> Any:
        seen.update(kwargs)
        raise callbacks_requests.ConnectionError("refused")

    import requests as callbacks_requests

    monkeypatch.setattr(callbacks_requests.Session, "post", fake_post)
    s = fast(RECEIPT_RESONATE_CALLBACK_URL="http://127.0.0.1:9/x")
    q = queue_for(sqlite_engine, callback_targets=s.callback_targets)
    q.cancel(enqueue(q, "factory").id)
    send_due(sqlite_engine, Sender(s))
    assert seen["timeout"] == 5.0 and seen["allow_redirects"] is False


def test_a_settlement_never_waits_for_the_target(targets: Any, sqlite_engine: Engine, redis_url: str) -> None:
    """The worker settles and returns while the target would hold the POST: the worker sends nothing."""
    from tasks.celery_app import make_celery

    release = threading.Event()
    slow = targets(hold=release)
    s = settings(RECEIPT_RESONATE_CALLBACK_URL=slow.url, REDIS_URL=redis_url, JOB_LEASE_MS="3000")
    queue = queue_for(sqlite_engine, callback_targets=s.callback_targets)

    def noop(ctx: JobContext) -> Any:
        return {"done": True}

    app = make_celery(s)
    registry = registry_of({"factory": noop})
    rt = Runtime(
        settings=s,
        app=app,
        engine=sqlite_engine,
        queue=queue,
        registry=registry,
        callbacks=Callbacks(s),
        delivery=DeliveryClient.through(app, s),
    )
    job = enqueue(queue, "factory")
    out = execute(rt, job.id, f"{job.id}:attempt:1", job.id, 0)
    assert out["status"] == "completed"
    assert not slow.entered.is_set()  # nothing was posted from the settling process
    [row] = outbox_rows(sqlite_engine, job.id)
    assert (row.event, row.state) == ("completed", "pending")
    release.set()
    send_due(sqlite_engine, Sender(s))
    got = slow.next()
    assert (got.body["event"], got.body["status"], got.body["result"]) == (
        "completed",
        "completed",
        {"done": True},
    )


def test_an_api_cancel_of_a_queued_job_sends_canceled(
    targets: Any, sqlite_engine: Engine, tmp_path: Any
) -> None:
    from tests.support.api import build_api, make_settings

    target = targets()
    s = make_settings(tmp_path, callback_url=target.url)
    api = build_api(sqlite_engine, s)
    job = api.job("a")
    response = api.client.post(
        f"/jobs/{job['id']}/cancel", json={"reason": "changed my mind"}, headers=api.headers()
    )
    assert response.status_code == 202
    send_due(sqlite_engine, Sender(s))
    got = target.next()
    assert (got.body["event"], got.body["jobId"], got.body["status"]) == ("canceled", job["id"], "canceled")
    assert (got.body["organizationId"], got.body["stream"]) == (job["organizationId"], job["stream"])


def test_an_api_cancel_of_a_running_job_sends_canceled_when_its_worker_settles(
    targets: Any, pg_engine: Engine, tmp_path: Any
) -> None:
    """Spec step 6: `canceled` is posted for a running job canceled through the API. The API only
    sends the abort (only the worker can stop work in flight); the worker's settlement after the
    abort is the `job.canceled` receipt the callback belongs to."""
    from tests.support.api import build_api, key, make_settings

    target = targets()
    s = make_settings(tmp_path, callback_url=target.url)
    api = build_api(pg_engine, s)
    job = api.job("a")
    started = threading.Event()

    def hold(ctx: JobContext) -> Any:
        started.set()
        ctx.wait_cancelled(WAIT_S)
        return {"stoppedBecause": ctx.cancel_reason}

    box: dict[str, AttemptResult] = {}

    def work() -> None:
        registry = registry_of({"factory": hold})
        box["out"] = run_attempt(api.queue, s, registry, key(job), 1, worker_id="worker-cb")

    worker = threading.Thread(target=work, daemon=True)
    worker.start()
    assert started.wait(WAIT_S)
    response = api.client.post(
        f"/jobs/{job['id']}/cancel", json={"reason": "stop now"}, headers=api.headers()
    )
    assert response.status_code == 202
    aborting = response.json
    assert aborting is not None
    assert (aborting["job"]["status"], aborting["job"]["abortRequested"]) == ("running", True)
    worker.join(WAIT_S * 2)
    assert not worker.is_alive() and box["out"].status == "canceled"
    with pg_engine.connect() as conn:
        canceled = store.read_stream(conn, job["stream"])[-1]
    # The worker's fenced settlement, not the API's abort command, is the terminal receipt ...
    assert (canceled.type, canceled.body["workerId"], canceled.body["reason"]) == (
        "job.canceled",
        "worker-cb",
        "stop now",
    )
    # ... and the one callback event is that receipt's.
    [row] = outbox_rows(pg_engine, key(job))
    assert (row.event, row.seq, row.target) == ("canceled", canceled.seq, target.url)
    assert send_due(pg_engine, Sender(s)) == {"delivered": 1, "failed": 0}
    got = target.next()
    assert (got.body["event"], got.body["jobId"], got.body["status"], got.body["attempt"]) == (
        "canceled",
        job["id"],
        "canceled",
        1,
    )
    assert got.body["error"] == "stop now" and got.body["seq"] == canceled.seq


def test_a_callback_goes_to_receipt_event_callback_url(targets: Any, pg_engine: Engine) -> None:
    """Spec step 6: callbacks go to RECEIPT_RESONATE_CALLBACK_URL / RECEIPT_EVENT_CALLBACK_URL; the
    second alone is a target too, and with both set each gets every event once."""
    events = targets("/events")
    s = settings(RECEIPT_EVENT_CALLBACK_URL=events.url)
    assert s.callback_targets == (events.url,)
    q = queue_for(pg_engine, callback_targets=s.callback_targets)
    job = enqueue(q, "factory")
    q.cancel(job.id, "stop")
    assert send_due(pg_engine, Sender(s)) == {"delivered": 1, "failed": 0}
    got = events.next()
    assert (got.path, got.body["event"], got.body["jobId"]) == ("/events", "canceled", job.client_id)

    resonate = targets("/resonate")
    both = settings(RECEIPT_RESONATE_CALLBACK_URL=resonate.url, RECEIPT_EVENT_CALLBACK_URL=events.url)
    q = queue_for(pg_engine, callback_targets=both.callback_targets)
    other = enqueue(q, "factory")
    q.cancel(other.id, "stop")
    assert send_due(pg_engine, Sender(both)) == {"delivered": 2, "failed": 0}
    first, second = resonate.next(), events.next()
    assert (first.path, second.path) == ("/resonate", "/events")
    assert first.body == second.body and first.body["jobId"] == other.client_id
    assert first.headers["webhook-id"] == second.headers["webhook-id"]  # one event, two targets


def test_with_tracing_on_a_delivery_is_a_span_in_the_jobs_trace_and_sends_its_traceparent(
    spans: Spans, targets: Any, sqlite_engine: Engine
) -> None:
    target = targets()
    s = settings(RECEIPT_RESONATE_CALLBACK_URL=target.url)
    q = queue_for(sqlite_engine, callback_targets=s.callback_targets)
    job = enqueue(q, "factory")
    assert job.trace_context is not None  # tracing on, no caller context: a root of its own
    q.cancel(job.id, "stop")
    assert send_due(sqlite_engine, Sender(s)) == {"delivered": 1, "failed": 0}
    span = spans.one("receipt.callback")
    trace_id = job.trace_context["traceparent"][3:35]
    assert f"{span.context.trace_id:032x}" == trace_id
    assert dict(span.attributes or {})["receipt.callback.event"] == "canceled"
    # The request carries the delivery span as its parent (flags: sampled, and W3C's random-id bit).
    assert target.next().headers["traceparent"][:52] == f"00-{trace_id}-{span.context.span_id:016x}"


def test_with_tracing_off_a_delivery_sends_no_traceparent(
    tracing_off: None, targets: Any, sqlite_engine: Engine
) -> None:
    target = targets()
    s = settings(RECEIPT_RESONATE_CALLBACK_URL=target.url)
    q = queue_for(sqlite_engine, callback_targets=s.callback_targets)
    q.cancel(enqueue(q, "factory").id, "stop")
    assert send_due(sqlite_engine, Sender(s)) == {"delivered": 1, "failed": 0}
    assert "traceparent" not in target.next().headers
