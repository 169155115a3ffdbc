"""Shared fixtures: one suite over every backend.

- ``engine`` is parametrised over SQLite and PostgreSQL: the same test body runs on both, for the
  storage contract; a module about the API's or the runtime's rules is marked ``one_backend`` and
  runs on PostgreSQL alone.
- PostgreSQL tests share their xdist worker's migrated database, emptied before each test
  (``tests/support/isolation.py``); a test marked ``own_database`` gets a fresh clone.
- PostgreSQL and Redis are the machine's when they answer on their usual ports, or private
  throwaway instances started for the session (``tests/support/services.py``); a service that
  is missing altogether skips its tests, and fails them in CI (``CI=true``).
"""

from __future__ import annotations

# Some names below (noqa: F401) are re-exported for tests written before tests/support existed;
# new tests import them from tests.support.
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.config import switch
from app.storage.db import make_engine
from app.storage.migrate import upgrade
from app.storage.queue import Queue
from tests.support import services
from tests.support.databases import (  # noqa: F401
    IN_CI,
    assert_projection_equals_fold,
    new_database,
    pg_url_for,
    unavailable,
    worker_suffix,
)
from tests.support.fake_redis import fake_redis  # noqa: F401 - the in-memory Redis fixture
from tests.support.isolation import OWN_DATABASE_MARKER, WorkerDatabase
from tests.support.processes import is_isolated
from tests.support.queue_ops import (
    close_queues,
    transactions,  # noqa: F401 - counts the transactions the queue opens
)
from tests.support.tracing import spans, tracing_off  # noqa: F401 - tracing on (in memory) or off


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if is_isolated(name):
            monkeypatch.delenv(name, raising=False)


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """The maintenance-database URL of this session's PostgreSQL (the machine's or a private one)."""
    try:
        with services.postgres_admin_url() as url:
            yield url
    except Exception as exc:  # a private server that cannot start: the same as an absent one
        unavailable("PostgreSQL (private instance)", exc)


@pytest.fixture(scope="session")
def pg_admin(pg_admin_url: str) -> Iterator[Engine]:
    engine = make_engine(pg_admin_url)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        engine.dispose()
        unavailable("PostgreSQL", exc)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def pg_template(pg_admin: Engine) -> Iterator[str]:
    with new_database(pg_admin, "receipt_tpl") as url:
        engine = make_engine(url)
        upgrade(engine)
        engine.dispose()
        yield url.rpartition("/")[2]


@pytest.fixture(scope="session")
def pg_worker_database(pg_admin: Engine, pg_template: str) -> Iterator[WorkerDatabase]:
    """This xdist worker's migrated database, shared by its tests one at a time."""
    with new_database(pg_admin, "receipt_w", pg_template) as url:
        database = WorkerDatabase(url)
        yield database
        database.close()


@pytest.fixture
def pg_database_url(request: pytest.FixtureRequest, pg_template: str) -> Iterator[str]:
    """URL of a migrated PostgreSQL database that holds nothing but what this test writes.

    The worker's shared database, emptied first; a test marked ``own_database`` (it changes the
    database itself: triggers, storage parameters) gets a fresh clone of its own instead."""
    if request.node.get_closest_marker(OWN_DATABASE_MARKER) is not None:
        pg_admin: Engine = request.getfixturevalue("pg_admin")
        with new_database(pg_admin, "receipt_t", pg_template) as url:
            yield url
        return
    database: WorkerDatabase = request.getfixturevalue("pg_worker_database")
    database.reset()
    yield database.url


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("sqlite-template") / "template.db"
    engine = make_engine(f"sqlite:///{path}")
    upgrade(engine)
    engine.dispose()
    return path


@pytest.fixture
def sqlite_database_url(sqlite_template: Path, tmp_path: Path) -> str:
    path = tmp_path / "receipt.db"
    shutil.copyfile(sqlite_template, path)
    return f"sqlite:///{path}"


def _opened(url: str) -> Iterator[Engine]:
    # RECEIPT_TEST_PREPARED_STATEMENTS=1 runs every in-process test with prepared statements on
    # (app/storage/direct.py), as RECEIPT_DB_PREPARED_STATEMENTS=enabled runs production.
    prepared = switch(os.environ.get("RECEIPT_TEST_PREPARED_STATEMENTS") or "0")
    engine = make_engine(url, prepared_statements=prepared)
    yield engine
    close_queues(engine)
    engine.dispose()


@pytest.fixture
def pg_engine(pg_database_url: str) -> Iterator[Engine]:
    yield from _opened(pg_database_url)


@pytest.fixture
def sqlite_engine(sqlite_database_url: str) -> Iterator[Engine]:
    yield from _opened(sqlite_database_url)


E2E_PREFIX = "tests/e2e/"


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup`` with every end-to-end test in one group, so one worker runs the
    deployments one after another while the other runs the unit and integration tiers.

    The tier is grouped by its path here, on the controller: the ``xdist_group`` marks the modules
    carry reach the scheduler only as a suffix the workers add to each node id, and with this
    pytest and pytest-xdist they arrive without it (every end-to-end module ran on both workers,
    two deployments at once)."""
    from xdist.scheduler import LoadGroupScheduling

    class EndToEndOnOneWorker(LoadGroupScheduling):  # type: ignore[misc]  # xdist ships no types
        def _split_scope(self, nodeid: str) -> str:
            return "e2e" if nodeid.startswith(E2E_PREFIX) else super()._split_scope(nodeid)

    return EndToEndOnOneWorker(config, log)


BACKENDS = ("sqlite", "postgres")
# Where the behaviour under test does not depend on storage (the API's and the runtime's rules
# above the queue), one backend is enough: the production one.
ONE_BACKEND = ("postgres",)


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """``backend`` is SQLite and PostgreSQL for the storage contract, PostgreSQL alone for a test
    marked ``one_backend``."""
    if "backend" in metafunc.fixturenames:
        marked = metafunc.definition.get_closest_marker("one_backend") is not None
        metafunc.parametrize("backend", ONE_BACKEND if marked else BACKENDS)


@pytest.fixture
def database_url(backend: str, request: pytest.FixtureRequest) -> str:
    """A fresh migrated database on the parametrised backend."""
    fixture = "sqlite_database_url" if backend == "sqlite" else "pg_database_url"
    return str(request.getfixturevalue(fixture))


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    yield from _opened(database_url)


@pytest.fixture
def queue(engine: Engine) -> Queue:
    return queue_for(engine)


@pytest.fixture(scope="session")
def redis_base_url() -> Iterator[str]:
    """This session's Redis, without a database number (the machine's or a private one)."""
    try:
        with services.redis_base_url() as url:
            yield url
    except Exception as exc:
        unavailable("Redis (private instance)", exc)


@pytest.fixture
def redis_url(redis_base_url: str) -> Iterator[str]:
    """A dedicated, flushed Redis database for this test."""
    import redis

    # One Redis database per xdist worker (8..15), so parallel workers never flush each other.
    index = int(worker_suffix().lstrip("gw") or 0)
    url = f"{redis_base_url}/{8 + index % 8}"
    client = redis.Redis.from_url(url)
    try:
        client.ping()
    except Exception as exc:
        unavailable("Redis", exc)
    client.flushdb()
    yield url
    client.flushdb()
    client.close()


@pytest.fixture
def projection_equals_fold() -> object:
    """The ``assert_projection_equals_fold(engine, job_id)`` checker, as a fixture."""
    return assert_projection_equals_fold
