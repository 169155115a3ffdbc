"""The broker epoch and queue probe against the real Redis test database."""

from __future__ import annotations

import time

import redis

from delivery.broker import EPOCH_CACHE_S, EPOCH_KEY, NullProbe, RedisProbe


def test_the_epoch_is_stable_until_the_broker_is_flushed(redis_url: str) -> None:
    probe = RedisProbe(redis_url)
    client = redis.Redis.from_url(redis_url)
    try:
        client.delete(EPOCH_KEY)
        first = probe.epoch()
        assert first is not None and client.get(EPOCH_KEY) == first.encode()
        assert RedisProbe(redis_url).epoch() == first  # every process reads the same incarnation
        client.flushdb()  # what FLUSHALL / FLUSHDB / an empty restart do to the key
        time.sleep(EPOCH_CACHE_S + 0.1)
        second = probe.epoch()
        assert second is not None and second != first
        assert RedisProbe(redis_url).epoch() == second
    finally:
        client.close()


def test_queue_emptiness_and_an_unreachable_broker(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    try:
        client.delete("probe-q1", "probe-q2")
        probe = RedisProbe(redis_url)
        assert probe.queues_empty(["probe-q1", "probe-q2"]) is True
        client.rpush("probe-q2", "message")
        assert probe.queues_empty(["probe-q1", "probe-q2"]) is False
        client.delete("probe-q2")
    finally:
        client.close()
    dead = RedisProbe("redis://127.0.0.1:1/0")
    assert dead.epoch() is None and dead.queues_empty(["q"]) is None  # unknown: nothing superseded
    assert NullProbe().epoch() is None and NullProbe().queues_empty(["q"]) is None
