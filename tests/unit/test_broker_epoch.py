"""The broker epoch and queue probe (delivery/broker.py) on an in-memory Redis. The same probe runs on
the real redis-server in tests/integration/test_broker_probe.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.config import Settings
from delivery.broker import EPOCH_KEY, FolderProbe, NullProbe, RedisProbe, probe_for
from delivery.folder_records import FolderRecords
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


def test_the_embedded_folder_broker_gets_a_probe_that_counts_its_files(tmp_path: Path) -> None:
    probe = probe_for(Settings(home=str(tmp_path)))
    assert isinstance(probe, FolderProbe)
    assert probe.epoch() is None
    assert probe.queue_lengths(["q"]) is None  # no folder yet: nothing is known
    data = tmp_path / "broker" / "data"
    data.mkdir(parents=True)
    (data / "1_a.q.msg").write_bytes(b"{}")
    (data / "2_b.q.msg.tmp").write_bytes(b"")  # being written: about to be there
    (data / "3_c.other.msg").write_bytes(b"{}")
    assert probe.queue_lengths(["q", "other", "empty"]) == {"q": 2, "other": 1, "empty": 0}
    assert probe.queues_empty(["empty"]) is True and probe.queues_empty(["q", "empty"]) is False
    assert isinstance(probe.client(), FolderRecords)
    assert not (tmp_path / "broker" / "records").exists()  # made on the first write, not by a probe
    assert NullProbe().queue_lengths(["q"]) is None
