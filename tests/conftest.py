"""Shared fixtures: one suite over every backend.

- ``engine`` is parametrised over SQLite and PostgreSQL: the same test body runs on both.
- PostgreSQL tests get a fresh database cloned from a migrated template (fast, isolated, and
  the append-only trigger stays on: tests never need to delete receipts).
- A service that is missing locally skips its tests; in CI (``CI=true``) it fails them.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import text
from sqlalchemy.engine import Engine

from app.storage.db import make_engine
from app.storage.migrate import upgrade
from app.storage.queue import Queue

PG_ADMIN_URL = os.environ.get("RECEIPT_TEST_PG_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432/postgres")
REDIS_TEST_BASE = os.environ.get("RECEIPT_TEST_REDIS_URL", "redis://127.0.0.1:6379")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# Variables a test must never inherit from the developer's shell.
_ISOLATED_PREFIXES = ("RECEIPT_", "RESONATE_", "JOB_LEASE_MS", "CODEX_JOB_LEASE_MS", "FACTORY_CONTROL_JOB_")
_ISOLATED_NAMES = ("DATABASE_URL", "REDIS_URL")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith(_ISOLATED_PREFIXES) or name in _ISOLATED_NAMES:
            if name.startswith("RECEIPT_TEST_"):
                continue
            monkeypatch.delenv(name, raising=False)


def _unavailable(what: str, exc: Exception) -> None:
    message = f"{what} is not reachable: {exc}"
    if IN_CI:
        pytest.fail(message + " (CI=true: services must be up)")
    pytest.skip(message)


def _worker_suffix() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "gw0")


def pg_url_for(database: str) -> str:
    base, _, _ = PG_ADMIN_URL.rpartition("/")
    return f"{base}/{database}"


@pytest.fixture(scope="session")
def pg_admin() -> Iterator[Engine]:
    engine = make_engine(PG_ADMIN_URL)
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception as exc:
        engine.dispose()
        _unavailable("PostgreSQL", exc)
    yield engine
    engine.dispose()


def _autocommit(admin: Engine, sql: str) -> None:
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(sql))


@pytest.fixture(scope="session")
def pg_template(pg_admin: Engine) -> Iterator[str]:
    name = f"receipt_tpl_{_worker_suffix()}_{uuid.uuid4().hex[:8]}"
    _autocommit(pg_admin, f"CREATE DATABASE {name}")
    engine = make_engine(pg_url_for(name))
    upgrade(engine)
    engine.dispose()
    yield name
    _autocommit(pg_admin, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@contextmanager
def cloned_database(admin: Engine, template: str, prefix: str) -> Iterator[str]:
    """A fresh database cloned from the migrated template; dropped (forcibly) on exit."""
    name = f"{prefix}_{_worker_suffix()}_{uuid.uuid4().hex[:10]}"
    _autocommit(admin, f"CREATE DATABASE {name} TEMPLATE {template}")
    try:
        yield pg_url_for(name)
    finally:
        _autocommit(admin, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture
def pg_database_url(pg_admin: Engine, pg_template: str) -> Iterator[str]:
    """URL of a fresh, migrated PostgreSQL database for this test alone."""
    with cloned_database(pg_admin, pg_template, "receipt_t") as url:
        yield url


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


@pytest.fixture
def pg_engine(pg_database_url: str) -> Iterator[Engine]:
    engine = make_engine(pg_database_url)
    yield engine
    engine.dispose()


@pytest.fixture
def sqlite_engine(sqlite_database_url: str) -> Iterator[Engine]:
    engine = make_engine(sqlite_database_url)
    yield engine
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgres"])
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def database_url(backend: str, request: pytest.FixtureRequest) -> str:
    """A fresh migrated database on the parametrised backend."""
    fixture = "sqlite_database_url" if backend == "sqlite" else "pg_database_url"
    return str(request.getfixturevalue(fixture))


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    eng = make_engine(database_url)
    yield eng
    eng.dispose()


@pytest.fixture
def queue(engine: Engine) -> Queue:
    return Queue(engine)


@pytest.fixture
def redis_url() -> Iterator[str]:
    """A dedicated, flushed Redis database for this test."""
    import redis

    # One Redis database per xdist worker (8..15), so parallel workers never flush each other.
    index = int(_worker_suffix().lstrip("gw") or 0)
    url = f"{REDIS_TEST_BASE}/{8 + index % 8}"
    client = redis.Redis.from_url(url)
    try:
        client.ping()
    except Exception as exc:
        _unavailable("Redis", exc)
    client.flushdb()
    yield url
    client.flushdb()
    client.close()


# -- projection == fold (added for the queue, concurrency and property tests) --------------------


def assert_projection_equals_fold(engine: Engine, job_id: str) -> None:
    """The ``jobs`` row of ``job_id`` must equal the fold of its receipt stream, column by column.

    Folds ``jobs/<job_id>`` with the pure reducer and compares it with ``Queue.get`` (the stored
    snapshot) and with every scan column the later issues query (status, attempt, lease_*,
    last_seq, last_hash, status_changed_at, ...).
    """
    from sqlalchemy import select

    from app.jobs.reducer import Job, fold
    from app.jobs.vocab import job_stream
    from app.storage import store
    from app.storage.db import as_utc, jobs, parse_iso

    with engine.connect() as conn:
        stream = store.read_stream(conn, job_stream(job_id))
        row = conn.execute(select(jobs).where(jobs.c.id == job_id)).first()
    folded: Job | None = None
    changed_at: str | None = None
    for r in stream:
        before = folded.status if folded is not None else None
        folded = fold([r.to_receipt()], folded)
        if folded is not None and folded.status != before:
            changed_at = r.at
    if folded is None:
        assert row is None, f"{job_id}: projection row exists but the stream folds to no job"
        return
    assert row is not None, f"{job_id}: stream folds to a job but there is no projection row"
    got = Queue(engine).get(job_id)
    assert got == folded, f"{job_id}: Queue.get differs from the fold"
    assert row.state == folded.to_json()
    last = stream[-1]
    lease = folded.lease
    expected = {
        "status": folded.status,
        "attempt": folded.attempt,
        "max_attempts": folded.max_attempts,
        "lease_worker_id": lease.worker_id if lease else None,
        "lease_attempt": lease.attempt if lease else None,
        "lease_expires_at": parse_iso(lease.expires_at) if lease else None,
        "abort_requested": folded.abort_requested,
        "organization_id": folded.organization_id,
        "agent_id": folded.agent_id,
        "lane": folded.lane,
        "kind": folded.kind,
        "session_key": folded.session_key,
        "created_at": parse_iso(folded.created_at),
        "updated_at": parse_iso(folded.updated_at),
        "status_changed_at": parse_iso(changed_at),
        "last_seq": last.seq,
        "last_hash": last.hash,
    }
    actual = {}
    for name in expected:
        value = getattr(row, name)
        if hasattr(value, "tzinfo") and value is not None:
            value = as_utc(value)
        actual[name] = value
    assert actual == expected, f"{job_id}: projection columns differ from the fold"
    assert folded.seq == last.seq


@pytest.fixture
def projection_equals_fold() -> object:
    """The ``assert_projection_equals_fold(engine, job_id)`` checker, as a fixture."""
    return assert_projection_equals_fold
