"""``make test`` without running services: private, throwaway PostgreSQL and Redis (tests/support).

The machine's own services are never stopped here: the fallback is reached by pointing the probe
at a port where nothing listens.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis
from sqlalchemy import create_engine, text

from devharness import services
from tests.support.waiting import free_port, port_open


@pytest.fixture
def nothing_on_the_usual_ports(monkeypatch: pytest.MonkeyPatch) -> None:
    closed = f"127.0.0.1:{free_port()}"
    for var in (services.PG_URL_VAR, services.REDIS_URL_VAR, services.PRIVATE_VAR):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(services.PG_PROBE_VAR, closed)
    monkeypatch.setenv(services.REDIS_PROBE_VAR, closed)


def _folder_of(pattern: str, marker: str) -> Path:
    """The one temporary folder (``/tmp/<pattern>``) holding ``marker``: this instance's, whatever
    other test sessions on the machine create and remove beside it meanwhile."""
    [folder] = [d for d in Path("/tmp").glob(pattern) if (d / marker).exists()]
    return folder


@pytest.mark.skipif(services.find_pg_ctl() is None, reason="PostgreSQL server binaries are not installed")
def test_with_nothing_on_5432_a_private_postgres_serves_the_session_and_is_removed(
    nothing_on_the_usual_ports: None,
) -> None:
    with services.postgres_admin_url() as url:
        port = urlsplit(url.replace("postgresql+psycopg2", "postgresql")).port
        assert port is not None and port_open("127.0.0.1", port)
        folder = _folder_of("receipt-pg-*", f".s.PGSQL.{port}")  # its socket lives in its folder
        engine = create_engine(url)
        try:
            with engine.connect() as conn:
                assert conn.execute(text("SELECT current_user")).scalar_one() == "postgres"
        finally:
            engine.dispose()
        assert services.resolved_pg_admin_url() == url
    assert not port_open("127.0.0.1", port), "the private PostgreSQL still listens"
    assert not folder.exists(), "its data folder was left behind"


@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_with_nothing_on_6379_a_private_redis_serves_the_session_and_is_removed(
    nothing_on_the_usual_ports: None,
) -> None:
    with services.redis_base_url() as url:
        port = urlsplit(url).port
        assert port is not None
        folder = _folder_of("receipt-redis-*", f"redis-server.{port}.pid")
        client = redis.Redis.from_url(f"{url}/8")
        try:
            assert client.ping()
        finally:
            client.close()
    assert not port_open("127.0.0.1", port), "the private Redis still listens"
    assert not folder.exists(), "its data folder was left behind"


def test_a_configured_url_is_used_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(services.PG_URL_VAR, "postgresql+psycopg2://someone@db.example:6543/postgres")
    monkeypatch.setenv(services.REDIS_URL_VAR, "redis://cache.example:6380")
    with services.postgres_admin_url() as pg, services.redis_base_url() as r:
        assert (pg, r) == (
            "postgresql+psycopg2://someone@db.example:6543/postgres",
            "redis://cache.example:6380",
        )


def test_never_means_no_private_instance(
    nothing_on_the_usual_ports: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(services.PRIVATE_VAR, "never")
    probe = services._probe(services.REDIS_PROBE_VAR, "127.0.0.1:6379")
    with services.redis_base_url() as url:
        assert url == f"redis://{probe[0]}:{probe[1]}"
