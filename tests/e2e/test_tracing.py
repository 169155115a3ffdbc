"""One trace per job across real processes: gunicorn, the driver, a worker group and beat export
their spans over OTLP/HTTP to a receiver on loopback (``tests/support/otlp.py``), and the job posted
with a ``traceparent`` shows as one trace from ``POST /agents/{id}/jobs`` to its terminal receipt,
through a redrive (the broker lost its wake-up) and a retry (its first attempt failed).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from devharness import handlers
from tests.support.otlp import OtlpReceiver, ReceivedSpan
from tests.support.processes import Harness
from tests.support.stack import ORG, Stack, make_stack
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e")]

TRACE = "0af7651916cd43dd8448eb211c80319c"
PARENT = f"00-{TRACE}-b7ad6b7169203331-01"


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver().start()
    try:
        yield r
    finally:
        r.close()


@pytest.fixture
def traced_stack(
    harness: Harness, pg_database_url: str, tmp_path: Path, receiver: OtlpReceiver
) -> Iterator[Stack]:
    s = make_stack(
        harness,
        pg_database_url,
        tmp_path / "home",
        OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint,
        # Export within a tenth of a second of a span's end, so the test waits on spans, not a timer.
        OTEL_BSP_SCHEDULE_DELAY="100",
    )
    try:
        yield s
    finally:
        s.close()
        harness.stop_all()


def _by_name(spans: list[ReceivedSpan], name: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.name == name]


def test_one_trace_from_the_post_to_the_terminal_receipt_across_processes_through_a_redrive_and_a_retry(
    traced_stack: Stack, receiver: OtlpReceiver
) -> None:
    stack = traced_stack
    # No driver runs: the enqueue's wake-up waits in Redis, then the broker loses it, so only the
    # queued redrive can deliver the job.
    stack.start("web")
    body: dict[str, Any] = {
        "payload": {
            "kind": "factory.run",
            "failAttempts": [1],
            "authContext": {"userId": "e2e-user", "organizationId": ORG},
        },
        "maxAttempts": 3,
    }
    response = stack.http.post(
        stack.url(f"/agents/{handlers.FAIL}/jobs"),
        json=body,
        headers={**stack.headers(), "traceparent": PARENT},
        timeout=15,
    )
    assert response.status_code == 202, response.text
    job = response.json()["job"]
    assert job["traceContext"]["traceparent"][3:35] == TRACE
    broker = redis.Redis.from_url(stack.redis_url)
    try:
        broker.flushdb()
    finally:
        broker.close()

    # The chat worker first: its slots are offered when the redrive's first pass runs, so that
    # pass sends the job itself.
    stack.start("chat")
    stack.start("driver", "beat")
    done = stack.wait_terminal(job["id"], timeout=60)
    assert (done.status, done.attempt) == ("completed", 2)
    key = stack.key(job["id"])
    assert any(":redrive:" in d.dispatch_key for d in stack.deliveries(job["id"]))

    def complete_trace() -> list[ReceivedSpan] | None:
        spans = receiver.in_trace(TRACE)
        attempts = _by_name(spans, "receipt.attempt")
        if len(attempts) < 2 or not _by_name(spans, "receipt.dispatch"):
            return None
        if not any(s.service == "receipt-web" for s in spans):
            return None
        return spans

    spans = wait_for(complete_trace, 30, what="every span of the job at the receiver")
    services = {s.service for s in spans}
    assert {"receipt-web", "receipt-driver", "receipt-worker-chat"} <= services, services
    server = [s for s in spans if s.service == "receipt-web" and s.parent_span_id == PARENT[36:52]]
    assert len(server) == 1, [(s.service, s.name) for s in spans]
    attempts = sorted(_by_name(spans, "receipt.attempt"), key=lambda s: int(s.attributes["receipt.attempt"]))
    assert [(a.attributes["receipt.attempt"], a.attributes["receipt.outcome"]) for a in attempts] == [
        (1, "failed"),
        (2, "completed"),
    ]
    assert all(a.service == "receipt-worker-chat" and a.attributes["receipt.job.id"] == key for a in attempts)
    # The retry's attempt links to the one before it.
    assert attempts[1].links == ((TRACE, attempts[0].span_id),)
    # Each handler run is a child of its attempt.
    handler_parents = {h.parent_span_id for h in _by_name(spans, "receipt.handler")}
    assert handler_parents == {a.span_id for a in attempts}
    # The redrive pass has a span of its own, in its own trace, linked to the job's.
    redrives = [s for s in receiver.spans() if s.name == "receipt.loop queued-redrive" and s.links]
    assert any(link[0] == TRACE for s in redrives for link in s.links)
    assert all(s.trace_id != TRACE for s in redrives)
