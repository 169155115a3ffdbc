"""Redis in memory for the unit tier (fakeredis): the Redis-touching units run without a server.

The code under test builds its clients as in production (``redis.Redis.from_url``, or
``redis.from_url`` inside the ``limits`` library); ``fake_redis`` hands it fakes that share one
in-memory server, which a test can take down and bring back. The same units run against the real
redis-server in tests/integration (``redis_url``), where the server's own behaviour is the subject.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import fakeredis
import pytest
import redis

URL = "redis://fake-redis:6379/0"


@dataclass
class FakeRedis:
    """The in-memory server every client made during the test talks to."""

    server: fakeredis.FakeServer

    def client(self) -> fakeredis.FakeRedis:
        return fakeredis.FakeRedis(server=self.server)

    def down(self) -> None:
        """Every call of every client fails as a refused connection would (``redis.ConnectionError``)."""
        self.server.connected = False

    def up(self) -> None:
        self.server.connected = True


@pytest.fixture
def fake_redis(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeRedis]:
    fake = FakeRedis(fakeredis.FakeServer())

    def from_url(url: str, **_options: Any) -> fakeredis.FakeRedis:
        # Timeouts and pool options mean nothing in memory; the URL's database is kept apart.
        return fakeredis.FakeRedis.from_url(url, server=fake.server)

    monkeypatch.setattr(redis.Redis, "from_url", staticmethod(from_url))
    monkeypatch.setattr(redis, "from_url", from_url)
    yield fake
