"""Retrying storage work: lost append races (``optimistic``) and transient storage errors
(``retry_transient``), each rule in one place.

- ``optimistic``: appends are optimistic (a stream's next seq is unique); the work that lost a
  race to another writer re-reads and re-decides from scratch, a bounded number of times.
- ``retry_transient``: spec step 5, "Every settlement is wrapped in a storage retry: 5 attempts,
  150 ms times attempt backoff, transient storage errors only".
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

from app.jobs.errors import AppendConflict, TransientStorageError
from app.storage.db import is_storage_outage
from app.storage.direct import lost_preparation

log = logging.getLogger("receipt.queue")

T = TypeVar("T")

MAX_CONFLICT_RETRIES = 50


def optimistic(attempt: Callable[[], T], *, what: str, rounds: int = MAX_CONFLICT_RETRIES) -> T:
    """``attempt()`` until it does not raise ``AppendConflict``; ``TransientStorageError`` naming
    ``what`` after ``rounds`` lost races (something else writes the same stream without pause)."""
    for _ in range(rounds):
        try:
            return attempt()
        except AppendConflict:
            continue
    raise TransientStorageError(f"{what}: gave up after {rounds} append conflicts")


def is_transient(exc: BaseException) -> bool:
    """Storage errors worth retrying: the database unreachable or restarting (the one outage
    classifier, ``db.is_storage_outage``), serialization failures and deadlocks, and a prepared
    statement the server lost inside a transaction (``direct.py`` prepares it again on the retry)."""
    if is_storage_outage(exc):
        return True
    orig = getattr(exc, "orig", None)
    if lost_preparation(orig):
        return True
    return getattr(orig, "pgcode", None) in {"40001", "40P01"}


def retry_transient(
    fn: Callable[[], Any],
    *,
    attempts: int = 5,
    backoff_ms: int = 150,
    sleep: Callable[[float], None] = time.sleep,
) -> Any:
    """Spec: settlements retry transient storage errors only — 5 attempts, 150 ms times attempt backoff."""
    for attempt in range(1, attempts + 1):
        try:
            return fn()
        except Exception as exc:
            if attempt == attempts or not is_transient(exc):
                raise
            log.warning("transient storage error (attempt %d/%d): %s", attempt, attempts, exc)
            sleep(backoff_ms * attempt / 1000)
    raise AssertionError("unreachable")
