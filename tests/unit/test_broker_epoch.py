"""The broker epoch and queue probe (delivery/broker.py) on an in-memory Redis. The same probe runs on
the real redis-server in tests/integration/test_broker_probe.py."""

from __future__ import annotations

import pytest

from app.config import Settings
from delivery.broker import EPOCH_KEY, NullProbe, RedisProbe, probe_for
from tests.support.fake_redis import URL, FakeRedis


def test_the_epoch_is_created_once_and_changes_only_when_the_broker_is_emptied(fake_redis: FakeRedis) -> None:
    first = RedisProbe(URL).epoch()
    client = fake_redis.client()
    assert first is not None and client.get(EPOCH_KEY) == first.encode()
    assert RedisProbe(URL).epoch() == first  # every process reads the same incarnation
    client.flushdb()  # what FLUSHALL, FLUSHDB or a restart without persistence do to the key
    second = RedisProbe(URL).epoch()
    assert second is not None and second != first
    assert RedisProbe(URL).epoch() == second


def test_queue_emptiness(fake_redis: FakeRedis) -> None:
    probe = RedisProbe(URL)
    assert probe.queues_empty(["q1", "q2"]) is True
    fake_redis.client().rpush("q2", "message")
    assert probe.queues_empty(["q1", "q2"]) is False
    assert probe.client() is not None


def test_a_broker_that_is_down_tells_nothing_and_supersedes_nothing(
    fake_redis: FakeRedis, caplog: pytest.LogCaptureFixture
) -> None:
    probe = RedisProbe(URL)
    fake_redis.down()
    assert probe.epoch() is None
    assert probe.queues_empty(["q"]) is None
    assert "could not read the broker epoch" in caplog.text
    fake_redis.up()
    assert probe.epoch() is not None


def test_the_embedded_folder_broker_gets_the_probe_that_knows_nothing() -> None:
    probe = probe_for(Settings())
    assert isinstance(probe, NullProbe)
    assert (probe.epoch(), probe.queues_empty(["q"]), probe.client()) == (None, None, None)
