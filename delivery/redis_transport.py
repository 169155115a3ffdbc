"""kombu's Redis transport, keeping one synchronous client per connection pool.

kombu builds a new ``redis.Redis`` object for every publish, ack and QoS pipeline
(``Channel.conn_or_acquire`` → ``_create_client``). redis-py's constructor copies its table of
response callbacks each time: under a burst that was 8 % of a driver's CPU and 5 % of a worker's
(``py-spy --gil``, bench/README.md "Per-job levers"). A ``redis.Redis`` object holds no
connection of its own: every command borrows one from the pool and returns it, so one object
per pool is safe to share between threads, and it is what kombu's own ``Channel.client`` does for
its asynchronous client. A new pool (kombu replaces it after a disconnect) gets a new client.

A message that cannot be decoded (bytes that are not JSON, no envelope kombu can read) is kept as
a dead letter (``app/ops/dead_letters.py``) and logged once with its queue and hash, where kombu's
``loads`` would raise inside the worker's consumer loop and stop the worker. The BRPOP read below
is kombu's own, with that one check in place of its ``loads``.

Selected by ``broker_transport`` for ``redis://`` and ``rediss://`` URLs (celeryconfig.py).
"""

from __future__ import annotations

from queue import Empty
from typing import Any

from kombu.transport import redis as kombu_redis
from kombu.utils import encoding

from app.ops.dead_letters import RedisDeadLetters
from delivery.envelope import decode_envelope

_encoding: Any = encoding  # kombu ships no type hints


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

    def _decoded(self, queue: str, item: bytes) -> Any:
        payload, reason = decode_envelope(self, item)
        if payload is None:
            RedisDeadLetters(self._create_client()).keep(queue, item, reason)
        return payload

    def _brpop_read(self, **options: Any) -> bool:
        me: Any = self  # kombu ships no type hints
        try:
            try:
                dest__item = self.client.parse_response(self.client.connection, "BRPOP", **options)
            except self.connection_errors:
                # Disconnect so that the next iteration reconnects (as kombu does).
                self.client.connection.disconnect()
                raise
            if not dest__item:
                raise Empty()
            dest, item = dest__item
            queue = _encoding.bytes_to_str(dest).rsplit(self.sep, 1)[0]
            self._queue_cycle.rotate(queue)
            payload = self._decoded(queue, item)
            if payload is not None:
                self.connection._deliver(payload, queue)
            return True
        finally:
            me._in_poll = None
            me._flush_brpop_reauth()

    def _get(self, queue: Any, timeout: Any = None) -> Any:
        me: Any = self
        with self.conn_or_acquire() as client:
            for pri in self.priority_steps:
                while True:
                    item = client.rpop(me._q_for_pri(queue, pri))
                    if not item:
                        break
                    payload = self._decoded(queue, item)
                    if payload is not None:
                        me._maybe_update_queues_expire(client, queue)
                        return payload
            me._maybe_update_queues_expire(client, queue)
            raise Empty()


class Transport(kombu_redis.Transport):
    Channel = Channel
