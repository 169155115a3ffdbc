"""The Redis transport that keeps one synchronous client per pool (tasks/redis_transport.py).

Real Redis: messages published and consumed through it arrive whole, and a publish reuses the
channel's client instead of building one per call, until kombu gives the channel a new pool.
"""

from __future__ import annotations

import uuid
from typing import Any

import kombu

from tasks.redis_transport import Channel, Transport

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
