"""kombu's Redis transport, keeping one synchronous client per connection pool.

kombu builds a new ``redis.Redis`` object for every publish, ack and QoS pipeline
(``Channel.conn_or_acquire`` → ``_create_client``). redis-py's constructor copies its table of
response callbacks each time: under a burst that was 8 % of a driver's CPU and 5 % of a worker's
(``py-spy --gil``, bench/README.md "Per-job levers"). A ``redis.Redis`` object holds no
connection of its own: every command borrows one from the pool and returns it, so one object
per pool is safe to share between threads, and it is what kombu's own ``Channel.client`` does for
its asynchronous client. A new pool (kombu replaces it after a disconnect) gets a new client.

Selected by ``broker_transport`` for ``redis://`` and ``rediss://`` URLs (celeryconfig.py).
"""

from __future__ import annotations

from typing import Any

from kombu.transport import redis as kombu_redis


class Channel(kombu_redis.Channel):
    _sync_client: tuple[Any, Any] | None = None

    def _create_client(self, asynchronous: bool = False) -> Any:
        parent: Any = super()  # kombu ships no type hints
        if asynchronous:
            return parent._create_client(asynchronous=True)
        pool = self.pool
        cached = self._sync_client
        if cached is None or cached[0] is not pool:
            cached = (pool, parent._create_client())
            self._sync_client = cached
        return cached[1]


class Transport(kombu_redis.Transport):
    Channel = Channel
