"""Fresh PostgreSQL databases for tests and benchmarks, each dropped when its user is done.

A test gets a database cloned from a migrated template (fast, isolated, and the append-only
trigger stays on: no test needs to delete receipts).
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import text
from sqlalchemy.engine import Engine

from devharness.services import resolved_pg_admin_url


def worker_suffix() -> str:
    """The xdist worker id (``gw0`` without xdist): keeps names and Redis databases apart."""
    return os.environ.get("PYTEST_XDIST_WORKER", "gw0")


def pg_url_for(database: str, admin_url: str | None = None) -> str:
    """The URL of ``database`` on the server of ``admin_url`` (default: the session's)."""
    base, _, _ = (admin_url or resolved_pg_admin_url()).rpartition("/")
    return f"{base}/{database}"


def autocommit(admin: Engine, sql: str) -> None:
    with admin.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text(sql))


@contextmanager
def new_database(admin: Engine, prefix: str, template: str | None = None) -> Iterator[str]:
    """A fresh database (a clone of ``template`` if given), dropped forcibly on exit; yields its URL."""
    name = f"{prefix}_{worker_suffix()}_{uuid.uuid4().hex[:10]}"
    autocommit(admin, f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
    try:
        yield pg_url_for(name, admin.url.render_as_string(hide_password=False))
    finally:
        autocommit(admin, f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
