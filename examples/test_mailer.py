"""Testing a handler with ``receipt.testing`` (docs/testing.md): no server, broker or database server.

Run it with ``.venv/bin/python -m pytest examples/test_mailer.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from app.config import Settings
from app.jobs.timing import retry_delay_ms
from receipt.testing import HandlerError, InlineRuntime, JobContext

SENT: list[str] = []


def send_mail(ctx: JobContext) -> Any:
    """The handler under test: refuses a bad address for good, retries a busy relay."""
    to = ctx.payload["to"]
    if to.endswith("@invalid"):
        raise HandlerError(f"no such domain: {to}", retryable=False)
    if ctx.payload.get("relayBusyOnAttempt") == ctx.attempt:
        raise HandlerError("relay busy", retryable=True)
    SENT.append(to)
    return {"sent": to}


def send_digest(ctx: JobContext) -> Any:
    """A long handler: one checkpoint per recipient, stopping cleanly when cancelled."""
    done = []
    for to in ctx.payload["recipients"]:
        ctx.progress({"done": done})
        if ctx.wait_cancelled(0):
            return {"stoppedAfter": done}
        if to == "slow@example.com":
            ctx.wait_cancelled(30)  # a slow recipient: only a cancel ends this wait early
            continue
        done.append(to)
    return {"done": done}


@pytest.fixture
def rt() -> Iterator[InlineRuntime]:
    SENT.clear()
    with InlineRuntime({"mailer": send_mail, "digest": send_digest}) as runtime:
        yield runtime


def test_a_mail_is_sent(rt: InlineRuntime) -> None:
    rt.enqueue("mailer", {"to": "a@example.com"}, jobId="welcome-1")
    rt.assert_enqueued("mailer", payload={"to": "a@example.com"})

    [ran] = rt.drain()

    assert ran.status == "completed"
    assert rt.job("welcome-1").result == {"sent": "a@example.com"}
    assert SENT == ["a@example.com"]


def test_a_bad_address_fails_without_retrying(rt: InlineRuntime) -> None:
    rt.enqueue("mailer", {"to": "x@invalid"}, jobId="bad", maxAttempts=3)
    [ran] = rt.drain()
    assert (ran.status, ran.error) == ("failed", "no such domain: x@invalid")
    assert rt.drain() == []


def test_a_busy_relay_is_retried_after_the_backoff(rt: InlineRuntime) -> None:
    rt.enqueue("mailer", {"to": "b@example.com", "relayBusyOnAttempt": 1}, jobId="b", maxAttempts=2)
    assert [r.status for r in rt.drain()] == ["failed"]
    assert rt.drain() == []  # backing off on the runtime's clock
    rt.clock.advance(ms=retry_delay_ms(1, rt.settings))
    assert [(r.attempt, r.status) for r in rt.drain()] == [(2, "completed")]


def test_no_backoff_retries_at_once() -> None:
    with InlineRuntime({"mailer": send_mail}, settings=Settings(retry_backoff_ms=0)) as rt:
        rt.enqueue("mailer", {"to": "c@example.com", "relayBusyOnAttempt": 1}, maxAttempts=2)
        assert [r.status for r in rt.drain()] == ["failed", "completed"]


def test_a_scheduled_reminder_waits_for_its_time(rt: InlineRuntime) -> None:
    rt.enqueue("mailer", {"to": "d@example.com"}, delayMs=3_600_000)
    assert rt.drain() == []
    rt.clock.advance(seconds=3600)
    assert [r.status for r in rt.drain()] == ["completed"]


def test_cancelling_a_digest_stops_it_at_a_checkpoint(rt: InlineRuntime) -> None:
    job = rt.enqueue("digest", {"recipients": ["a@example.com", "slow@example.com", "z@example.com"]})
    running = rt.start(job.id)
    running.wait_for(lambda j: j.progress == {"done": ["a@example.com"]})

    rt.cancel(job.id, "unsubscribed")

    assert running.wait().status == "canceled"
    assert rt.job(job.id).status == "canceled"
