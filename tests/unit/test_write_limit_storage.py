"""The write limit's counters in Redis (api/limits.py, through the ``limits`` library's Redis storage
and its Lua script) on an in-memory Redis: shared by every API process, and counted in memory while
Redis is down. tests/integration/api/test_bounds.py runs the limit through the API on the real
redis-server."""

from __future__ import annotations

import logging

import pytest
from flask import Flask, g

from api.auth import Identity
from api.errors import ApiError
from api.limits import KEY_PREFIX, STORAGE_RETRY_S, WriteLimit
from tests.support.fake_redis import URL, FakeRedis

ORG = "org-a"
ENDPOINT = "jobs.enqueue"


@pytest.fixture
def app() -> Flask:
    made = Flask("limit-under-test")
    made.add_url_rule("/agents/<agentId>/jobs", ENDPOINT, lambda agentId: "", methods=["POST"])
    return made


def post(app: Flask, limit: WriteLimit, org: str = ORG) -> int:
    """One write through ``limit``: 202, or the 429 it raised."""
    with app.test_request_context("/agents/a/jobs", method="POST"):
        g.identity = Identity(org, system=False)
        try:
            limit.check()
        except ApiError as exc:
            assert exc.headers is not None and int(exc.headers["Retry-After"]) >= 1
            return exc.status
    return 202


def test_every_api_process_counts_against_one_budget_per_organisation(
    fake_redis: FakeRedis, app: Flask
) -> None:
    first, second = WriteLimit("3/minute", URL), WriteLimit("3/minute", URL)
    assert [post(app, first), post(app, second), post(app, first)] == [202, 202, 202]
    assert post(app, second) == 429  # the other process sees the same counter
    assert post(app, first, org="org-b") == 202  # another organisation has its own
    keys = [k.decode() if isinstance(k, bytes) else k for k in fake_redis.client().keys("*")]
    assert any(KEY_PREFIX in k and f"org:{ORG}" in k and ENDPOINT in k for k in keys), keys


def test_while_redis_is_down_writes_are_counted_in_memory_and_go_back_to_redis_after(
    fake_redis: FakeRedis, app: Flask, caplog: pytest.LogCaptureFixture
) -> None:
    now = [100.0]
    limit = WriteLimit("2/minute", URL, clock=lambda: now[0])
    assert post(app, limit) == 202  # counted in Redis
    fake_redis.down()
    with caplog.at_level(logging.WARNING, logger="receipt.api"):
        assert [post(app, limit), post(app, limit), post(app, limit)] == [
            202,
            202,
            429,
        ]  # memory's own budget
    assert "falling back to in-memory storage" in caplog.text
    fake_redis.up()
    now[0] += STORAGE_RETRY_S / 2
    assert post(app, limit, org="org-b") == 202  # within the retry interval: still memory
    assert fake_redis.client().keys("*org:org-b*") == []
    now[0] += STORAGE_RETRY_S
    # Redis answers again and its count resumes where it was (1): one more write, then the 429.
    assert [post(app, limit), post(app, limit)] == [202, 429]
    assert post(app, limit, org="org-b") == 202
    assert fake_redis.client().keys("*org:org-b*") != []
