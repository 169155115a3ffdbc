"""The Redis transport that keeps one synchronous client per pool (delivery/redis_transport.py).

Real Redis: messages published and consumed through it arrive whole, and a publish reuses the
channel's client instead of building one per call, until kombu gives the channel a new pool.
"""

from __future__ import annotations

import uuid
from typing import Any

import kombu

from delivery.redis_transport import Channel, Transport

_kombu: Any = kombu  # kombu ships no type hints


def test_publish_and_consume_reuse_one_client_per_pool(redis_url: str) -> None:
    name = f"t-transport-{uuid.uuid4().hex[:8]}"
    queue: Any = _kombu.Queue(name, _kombu.Exchange(name, type="direct"), routing_key=name)
    with _kombu.Connection(redis_url, transport=Transport) as conn:
        channel = conn.default_channel
        assert isinstance(channel, Channel)
        producer = conn.Producer(channel)
        for i in range(3):
            producer.publish({"n": i}, exchange=queue.exchange, routing_key=name, declare=[queue])
        first = channel._create_client()
        assert channel._create_client() is first
        got = []
        for _ in range(3):
            message = queue(channel).get(no_ack=False)
            assert message is not None
            got.append(message.payload["n"])
            message.ack()
        assert got == [0, 1, 2]
        assert queue(channel).get() is None
        assert channel._create_client() is first
        # A replaced pool (kombu makes a new one after a disconnect) gets a client of its own.
        channel._pool = None
        replaced = channel._create_client()
        assert replaced is not first
        assert replaced.connection_pool is channel.pool
        queue(channel).delete()


def test_without_ack_emulation_a_fetched_message_leaves_no_copy_and_a_close_puts_back_the_unacked(
    redis_url: str,
) -> None:
    """Receipt's broker options (celeryconfig.py): kombu keeps no unacked copy in Redis (the
    two pipelined writes per message that ack emulation costs), yet a message fetched and never
    acknowledged is put back when its consumer closes (a warm shutdown)."""
    import redis

    from app.config import Settings
    from celeryconfig import broker_transport_options_for

    options = broker_transport_options_for(Settings.from_env({"REDIS_URL": redis_url}))
    assert options == {"ack_emulation": False}
    name = f"t-noack-{uuid.uuid4().hex[:8]}"
    queue: Any = _kombu.Queue(name, _kombu.Exchange(name, type="direct"), routing_key=name)
    client = redis.Redis.from_url(redis_url)
    with _kombu.Connection(redis_url, transport=Transport, transport_options=options) as conn:
        channel = conn.default_channel
        producer = conn.Producer(channel)
        for i in range(2):
            producer.publish({"n": i}, exchange=queue.exchange, routing_key=name, declare=[queue])
        acked = queue(channel).get(no_ack=False)
        held = queue(channel).get(no_ack=False)
        assert acked is not None and held is not None
        assert (acked.payload["n"], held.payload["n"]) == (0, 1)
        # Nothing of either message is left in Redis while they are held: no unacked hash entry.
        assert client.llen(name) == 0
        assert not client.exists(channel.unacked_key) and not client.exists(channel.unacked_index_key)
        acked.ack()
    # The channel closed with `held` fetched and not acknowledged: it is back on its queue.
    with _kombu.Connection(redis_url, transport=Transport, transport_options=options) as conn:
        again = queue(conn.default_channel).get(no_ack=True)
        assert again is not None and again.payload["n"] == 1
        assert queue(conn.default_channel).get(no_ack=True) is None
        queue(conn.default_channel).delete()
