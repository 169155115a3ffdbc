"""Broker reconnect backoff (spec: "reconnects with a backoff that starts at 1 s and doubles to a 30 s
ceiling")."""

from __future__ import annotations

import itertools
from types import SimpleNamespace
from typing import Any

import pytest

from tasks import consumer
from tasks.consumer import BackoffConsumer, reconnect_delays
from workers.slots import Slots


def test_reconnect_delays_start_at_1s_double_and_cap_at_30s() -> None:
    assert list(itertools.islice(reconnect_delays(), 9)) == [1, 2, 4, 8, 16, 30, 30, 30, 30]


def test_reconnect_delays_never_end() -> None:
    # "Retry forever": the generator has no last element.
    delays = reconnect_delays()
    for _ in range(1000):
        assert next(delays) <= 30


class _FlakyConnection:
    """Fails ``failures`` times with a connection error, then connects."""

    connection_errors = (ConnectionError,)

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls = 0

    def connect(self) -> None:
        self.calls += 1
        if self.calls <= self.failures:
            raise ConnectionError("broker down")

    def as_uri(self) -> str:
        return "redis://127.0.0.1:6379/0"


def test_ensure_connected_sleeps_the_doubling_delays_until_the_broker_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    slept: list[float] = []
    monkeypatch.setattr("tasks.consumer.time.sleep", slept.append)
    conn = _FlakyConnection(failures=7)
    fake_self: Any = SimpleNamespace(first_connection_attempt=True, broker_connection_retry_attempt=0)
    assert BackoffConsumer.ensure_connected(fake_self, conn) is conn
    assert conn.calls == 8
    assert slept == [1, 2, 4, 8, 16, 30, 30]
    # A successful connection resets the consumer's retry bookkeeping.
    assert fake_self.broker_connection_retry_attempt == 0
    assert fake_self.first_connection_attempt is False


def test_ensure_connected_does_not_swallow_non_connection_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("tasks.consumer.time.sleep", lambda _s: None)

    class Broken(_FlakyConnection):
        def connect(self) -> None:
            raise ValueError("bad configuration")

    fake_self: Any = SimpleNamespace(first_connection_attempt=True, broker_connection_retry_attempt=0)
    with pytest.raises(ValueError):
        BackoffConsumer.ensure_connected(fake_self, Broken(0))


class _Hub:
    def __init__(self) -> None:
        self.timers: list[tuple[float, Any]] = []

    def call_repeatedly(self, delay: float, callback: Any, *args: Any) -> None:
        self.timers.append((delay, callback))


def _consumer_with(disable_prefetch: bool) -> Any:
    """A BackoffConsumer without Celery's worker machinery: only what registration touches."""
    sent: list[str] = []
    obj: Any = BackoffConsumer.__new__(BackoffConsumer)
    obj.blueprint = SimpleNamespace(send_all=lambda *a, **k: sent.append("send_all"))
    obj.app = SimpleNamespace(conf=SimpleNamespace(worker_disable_prefetch=disable_prefetch))
    obj.sent = sent
    return obj


def test_without_prefetch_the_event_loop_ticks_often_enough_to_resume_consuming() -> None:
    """A threads pool cannot wake the loop when a slot frees; a short tick bounds the resume delay."""
    hub = _Hub()
    fake = _consumer_with(disable_prefetch=True)
    BackoffConsumer.register_with_event_loop(fake, hub)
    assert fake.sent == ["send_all"]  # Celery's own registration still happens
    assert [delay for delay, _ in hub.timers] == [consumer.RESUME_TICK_S]
    assert consumer.RESUME_TICK_S <= 0.05


def test_with_prefetch_no_extra_tick_is_registered() -> None:
    hub = _Hub()
    BackoffConsumer.register_with_event_loop(_consumer_with(disable_prefetch=False), hub)
    assert hub.timers == []


def test_no_message_is_fetched_while_every_slot_of_the_process_is_taken() -> None:
    """A batch runs several attempts on one Celery thread: the slots, not the pool, say when to fetch."""
    fake = _consumer_with(disable_prefetch=True)
    slots = Slots(2)
    fake.app.receipt_slots = slots
    celery_says = [True]
    qos = SimpleNamespace(can_consume=lambda: celery_says[0])
    fake.task_consumer = SimpleNamespace(channel=SimpleNamespace(qos=qos))
    BackoffConsumer.register_with_event_loop(fake, _Hub())
    assert qos.can_consume() is True
    assert slots.take(2, 0) == 2
    assert qos.can_consume() is False  # every slot taken: fetch nothing
    slots.give(1)
    assert qos.can_consume() is True
    celery_says[0] = False
    assert qos.can_consume() is False  # Celery's own limit still holds
    # A reconnect registers again: the gate is not stacked on itself.
    BackoffConsumer.register_with_event_loop(fake, _Hub())
    celery_says[0] = True
    assert qos.can_consume() is True
