"""Single-flight guards for the recovery loops, so duplicate beats do no harm and dead passes don't.

A loop pass first *claims* its row in ``loop_runs`` with a conditional update: it succeeds only
if no live pass holds the row and the previous pass started at least ``min_interval_ms`` ago. Two
beats firing the same schedule 0.3 s apart therefore run one pass.

A claim carries a deadline (``expires_at``, database clock) that a live pass renews as it goes.
A pass that dies -- its process SIGKILLed, or its database connection cut so that even the
release in ``finally`` fails -- frees the loop when that deadline passes, about one interval
later, instead of holding it until some much longer staleness bound.

The rows are best-effort bookkeeping; losing them only allows one extra (idempotent) pass.
They also say when each loop last ran, which ``/readyz`` and the local ticker read.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import TracebackType

from sqlalchemy import and_, or_, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from app.config import Settings
from app.storage.db import as_utc, db_now, loop_runs, transaction

log = logging.getLogger("receipt.loops")

# A claim's shortest life: long enough for a loaded pass to renew it before it lapses.
MIN_CLAIM_TTL_MS = 2000


def claim_ttl_ms(interval_ms: int) -> int:
    """A claim lives one interval (at least ``MIN_CLAIM_TTL_MS``) unless its pass renews it."""
    return max(interval_ms, MIN_CLAIM_TTL_MS)


def claim(engine: Engine, name: str, owner: str, *, min_interval_ms: int, ttl_ms: int) -> bool:
    """Take the loop for one pass; False when a live pass holds it or one ran too recently."""
    try:
        return _claim(engine, name, owner, min_interval_ms, ttl_ms)
    except IntegrityError:
        return False  # another process created the row in the same instant: it holds this pass


def _claim(engine: Engine, name: str, owner: str, min_interval_ms: int, ttl_ms: int) -> bool:
    with transaction(engine) as conn:
        now = db_now(conn)
        expires = now + timedelta(milliseconds=ttl_ms)
        exists = conn.execute(select(loop_runs.c.name).where(loop_runs.c.name == name)).first()
        if exists is None:
            conn.execute(
                loop_runs.insert().values(
                    name=name, started_at=now, finished_at=None, owner=owner, expires_at=expires
                )
            )
            return True
        c = loop_runs.c
        idle = or_(
            c.finished_at >= c.started_at,
            c.expires_at.is_(None),
            c.expires_at <= now,
        )
        spaced = or_(c.started_at.is_(None), c.started_at <= now - timedelta(milliseconds=min_interval_ms))
        result = conn.execute(
            update(loop_runs)
            .where(c.name == name, and_(idle, spaced))
            .values(started_at=now, finished_at=None, owner=owner, expires_at=expires)
        )
        return result.rowcount == 1


def renew(engine: Engine, name: str, owner: str, ttl_ms: int) -> bool:
    """Push a live claim's deadline forward; False if this owner no longer holds the loop."""
    with transaction(engine) as conn:
        now = db_now(conn)
        c = loop_runs.c
        result = conn.execute(
            update(loop_runs)
            .where(c.name == name, c.owner == owner, c.finished_at.is_(None), c.expires_at >= now)
            .values(expires_at=now + timedelta(milliseconds=ttl_ms))
        )
        return result.rowcount == 1


def release(engine: Engine, name: str, owner: str) -> None:
    with transaction(engine) as conn:
        now = db_now(conn)
        conn.execute(
            update(loop_runs)
            .where(loop_runs.c.name == name, loop_runs.c.owner == owner)
            .values(finished_at=now)
        )


class Renewal:
    """Renews a held claim from a background thread while a pass with no keep-alive hook runs.

    The thread dies with its process, so a SIGKILLed pass stops renewing and its claim lapses on
    its deadline; a pass whose database went away cannot renew either, with the same result.
    """

    def __init__(self, engine: Engine, name: str, owner: str, ttl_ms: int) -> None:
        self._engine, self._name, self._owner, self._ttl_ms = engine, name, owner, ttl_ms
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"renew-{name}", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._ttl_ms / 3000):
            try:
                if not renew(self._engine, self._name, self._owner, self._ttl_ms):
                    log.warning("%s: the pass lost its claim; it is no longer renewed", self._name)
                    return
            except Exception as exc:  # the claim lapses on its deadline; the pass itself decides
                log.warning("%s: could not renew the claim (%s)", self._name, exc)

    def __enter__(self) -> Renewal:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            release(self._engine, self._name, self._owner)
        except Exception as error:  # the database may be what ended the pass: the deadline frees it
            log.warning("could not release %s (%s); its claim lapses on its deadline", self._name, error)


@dataclass(frozen=True)
class LoopRun:
    """When a loop last started a pass and, if it finished, when."""

    name: str
    started_at: datetime | None
    finished_at: datetime | None


def last_runs(engine: Engine) -> tuple[datetime, dict[str, LoopRun]]:
    """The database clock and every loop's last pass."""
    with engine.connect() as conn:
        now = db_now(conn)
        rows = conn.execute(select(loop_runs.c.name, loop_runs.c.started_at, loop_runs.c.finished_at)).all()
    return now, {
        r.name: LoopRun(
            r.name,
            as_utc(r.started_at) if r.started_at is not None else None,
            as_utc(r.finished_at) if r.finished_at is not None else None,
        )
        for r in rows
    }


# -- which loops exist, and when one is overdue -------------------------------------------------------

REDRIVE_LOOP = "queued-redrive"
RETRY_LOOP = "due-retries"
EXPIRY_LOOP = "lease-expiry"
STALE_FACTOR = 3  # issue 11/13: a loop whose last run is older than 3 intervals is overdue


CALLBACK_LOOP = "callbacks"


def loop_intervals(settings: Settings) -> dict[str, int]:
    """Every recovery loop this deployment runs, and its interval in milliseconds.

    The callback sender runs only where callbacks are configured.
    """
    intervals = {
        REDRIVE_LOOP: settings.queued_redrive_interval_ms,
        RETRY_LOOP: settings.retry_scan_interval_ms,
        EXPIRY_LOOP: settings.lease_expiry_interval_ms,
    }
    if settings.callback_targets:
        intervals[CALLBACK_LOOP] = settings.callback_send_interval_ms
    return intervals


def overdue(
    last: datetime | None, since: datetime, now: datetime, interval_ms: int, factor: int = STALE_FACTOR
) -> bool:
    """Pure rule: a loop is overdue when its last pass started more than 3 (``factor``) intervals ago.

    A loop that never ran counts from ``since`` (the observing process's start), so a fresh
    deployment gets the same grace before anything is called overdue.
    """
    reference = last if last is not None else since
    return now - reference > timedelta(milliseconds=factor * interval_ms)
