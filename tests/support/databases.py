"""A missing service's skip (a failure in CI), and the check that the projection equals the fold.

Fresh databases come from ``devharness.databases`` (re-exported here for the tests). A missing
service skips its tests; in CI (``CI=true``) it fails them.
"""

from __future__ import annotations

import os
from typing import Any, NoReturn

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.jobs.reducer import Job, fold
from app.jobs.vocab import job_stream
from app.storage import store
from app.storage.db import as_utc, jobs, parse_iso
from devharness.databases import autocommit, new_database, pg_url_for, worker_suffix

__all__ = [
    "IN_CI",
    "assert_projection_equals_fold",
    "autocommit",
    "new_database",
    "pg_url_for",
    "unavailable",
    "worker_suffix",
]

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def unavailable(what: str, exc: Exception) -> NoReturn:
    """Skip the test for a missing service, or fail it in CI where services must be up."""
    message = f"{what} is not reachable: {exc}"
    if IN_CI:
        pytest.fail(message + " (CI=true: services must be up)")
    pytest.skip(message)


# Projection columns that hold a folded field as it is.
_FOLDED_COLUMNS = (
    "status",
    "attempt",
    "max_attempts",
    "abort_requested",
    "organization_id",
    "agent_id",
    "lane",
    "kind",
    "session_key",
)


def assert_projection_equals_fold(engine: Engine, job_id: str) -> None:
    """The ``jobs`` row of ``job_id`` must equal the fold of its receipt stream, column by column.

    Folds ``jobs/<job_id>`` with the pure reducer and compares it with ``Queue.get`` (the stored
    snapshot) and with every scan column the queries use (status, attempt, lease_*, last_seq,
    last_hash, status_changed_at, ...).
    """
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
    got = queue_for(engine).get(job_id)
    assert got == folded, f"{job_id}: Queue.get differs from the fold"
    assert row.state == folded.to_json()
    last = stream[-1]
    # Recomputed from the fold, independently of app.storage.projection (else the check is circular).
    expected: dict[str, Any] = {name: getattr(folded, name) for name in _FOLDED_COLUMNS}
    lease = folded.lease
    expected["lease_worker_id"] = lease.worker_id if lease else None
    expected["lease_attempt"] = lease.attempt if lease else None
    expected["lease_expires_at"] = parse_iso(lease.expires_at) if lease else None
    for name in ("created_at", "updated_at"):
        expected[name] = parse_iso(getattr(folded, name))
    expected["status_changed_at"] = parse_iso(changed_at)
    expected["last_seq"], expected["last_hash"] = last.seq, last.hash
    actual = {}
    for name in expected:
        value = getattr(row, name)
        if hasattr(value, "tzinfo") and value is not None:
            value = as_utc(value)
        actual[name] = value
    assert actual == expected, f"{job_id}: projection columns differ from the fold"
    assert folded.seq == last.seq
