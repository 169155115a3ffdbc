"""The embedded folder transport never exposes a half-written message, and neither broker lets an
undecodable message stop a consumer: it becomes a dead letter, listed by ``receipt dead-letters``
(delivery/folder_transport.py, delivery/redis_transport.py, app/ops/dead_letters.py)."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from queue import Empty
from typing import Any

import kombu
import pytest

from app.config import Settings
from app.ops import dead_letters
from celeryconfig import broker_transport_options_for
from delivery import folder_transport
from delivery.redis_transport import Transport as RedisTransport

_kombu: Any = kombu  # kombu ships no type hints


def _folder_connection(home: Path) -> Any:
    options = broker_transport_options_for(Settings.from_env({"RECEIPT_HOME": str(home)}))
    return _kombu.Connection(
        "filesystem://localhost/", transport=folder_transport.Transport, transport_options=options
    )


def _queue(name: str) -> Any:
    return _kombu.Queue(name, _kombu.Exchange(name, type="direct"), routing_key=name)


def test_a_folder_message_is_visible_only_whole(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer looking between the write and the rename finds no message, and no temporary
    name is left behind; kombu's own transport wrote the final name first (kombu#1551)."""
    q = _queue("t-atomic")
    seen_between: list[str] = []
    real_replace = os.replace
    with _folder_connection(tmp_path) as conn:
        channel = conn.default_channel
        assert isinstance(channel, folder_transport.Channel)

        def replace(src: str, dst: str) -> None:
            assert src.endswith(".tmp") and Path(src).stat().st_size > 0
            try:
                channel._get("t-atomic")
                seen_between.append("a message")
            except Empty:
                seen_between.append("nothing")
            real_replace(src, dst)

        monkeypatch.setattr(os, "replace", replace)
        conn.Producer(channel).publish({"n": 1}, exchange=q.exchange, routing_key="t-atomic", declare=[q])
        monkeypatch.setattr(os, "replace", real_replace)
        assert seen_between == ["nothing"]
        data = tmp_path / "broker" / "data"
        assert [n for n in os.listdir(data) if n.endswith(".tmp")] == []
        message = q(channel).get(no_ack=True)
        assert message is not None and message.payload == {"n": 1}


def test_an_undecodable_folder_message_becomes_a_dead_letter_and_the_next_one_is_delivered(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    q = _queue("t-dead")
    data = tmp_path / "broker" / "data"
    with _folder_connection(tmp_path) as conn:
        channel = conn.default_channel
        producer = conn.Producer(channel)
        producer.publish({"n": 0}, exchange=q.exchange, routing_key="t-dead", declare=[q])
        # Older names than the good message: the consumer meets them first.
        (data / f"1_{uuid.uuid4()}.t-dead.msg").write_bytes(b"")
        (data / f"2_{uuid.uuid4()}.t-dead.msg").write_bytes(b'{"body": "x", "prop')
        (data / f"3_{uuid.uuid4()}.t-dead.msg").write_bytes(b'{"properties": {"delivery_tag": "t"}}')
        with caplog.at_level("ERROR", logger="receipt.dead_letters"):
            message = q(channel).get(no_ack=True)
        assert message is not None and message.payload == {"n": 0}
        assert q(channel).get(no_ack=True) is None
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 3
    assert all("undecodable message on queue t-dead (sha256 " in line for line in lines)
    assert "empty message" in lines[0] and "not JSON" in lines[1] and "delivery_info" in lines[2]
    listed = dead_letters.store_for(Settings.from_env({"RECEIPT_HOME": str(tmp_path)})).listed(10)
    assert sorted(d.size for d in listed) == [0, 19, 37]
    assert {d.queue for d in listed} == {"t-dead"}
    assert dead_letters.digest(b"") in {d.sha256 for d in listed}
    assert os.listdir(data) == []


def test_an_undecodable_redis_message_becomes_a_dead_letter_on_both_read_paths(redis_url: str) -> None:
    """Garbage pushed onto a queue's list: kombu's ``loads`` raised in the consumer loop. Both the
    BRPOP read (a consumer's event loop) and the RPOP read (``get``) keep it aside and go on."""
    import redis

    name = f"t-dead-{uuid.uuid4().hex[:8]}"
    q = _queue(name)
    client = redis.Redis.from_url(redis_url)
    with _kombu.Connection(redis_url, transport=RedisTransport) as conn:
        channel = conn.default_channel
        producer = conn.Producer(channel)
        q(channel).declare()
        client.lpush(name, b"\x00garbage")
        producer.publish({"n": 1}, exchange=q.exchange, routing_key=name)
        got: list[Any] = []

        def on_message(body: Any, message: Any) -> None:
            got.append(body)
            message.ack()

        consumer = conn.Consumer(q, callbacks=[on_message])
        with consumer:
            for _ in range(5):
                if got:
                    break
                try:
                    conn.drain_events(timeout=1)
                except TimeoutError:
                    continue
        assert got == [{"n": 1}]
        client.lpush(name, b"[1, 2]")
        producer.publish({"n": 2}, exchange=q.exchange, routing_key=name)
        message = q(channel).get(no_ack=True)
        assert message is not None and message.payload == {"n": 2}
    entries = [json.loads(e) for e in client.lrange(dead_letters.REDIS_KEY, 0, -1)]
    assert [(e["queue"], e["size"]) for e in entries] == [(name, 6), (name, 8)]
    assert entries[1]["sha256"] == dead_letters.digest(b"\x00garbage")
    listed = dead_letters.store_for(Settings.from_env({"REDIS_URL": redis_url})).listed(10)
    assert [d.queue for d in listed] == [name, name]


def test_receipt_dead_letters_lists_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from app.ops.cli import main

    store = dead_letters.FolderDeadLetters(tmp_path / "broker" / "dead")
    store.keep_copy("receipt-chat", b"not json", "not JSON")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RECEIPT_HOME", str(tmp_path))
        mp.delenv("REDIS_URL", raising=False)
        mp.delenv("DATABASE_URL", raising=False)
        assert main(["dead-letters"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["count"] == 1
    row = shown["rows"][0]
    assert row["queue"] == "receipt-chat" and row["size"] == 8
    assert row["sha256"] == dead_letters.digest(b"not json")
