"""Single-flight guards for the recovery loops, so duplicate beats do no harm and dead passes don't.

A loop pass first *claims* its row in ``loop_runs`` with a conditional update: it succeeds only
if no live pass holds the row and the previous pass started at least ``min_interval_ms`` ago. Two
beats firing the same schedule 0.3 s apart therefore run one pass.

A claim carries a deadline (``expires_at``, database clock) that a live pass renews as it goes.
A pass that dies -- its process SIGKILLed, or its database connection cut so that even the
release in ``finally`` fails -- frees the loop when that deadline passes, about one interval
later, instead of holding it until some much longer staleness bound.

``run_claimed`` is the one wrapper every pass runs in: claim, renew (at the pass's item boundaries,
or from a background thread for a loop that keeps ownership while slow), observe an optional
deadline, release. Which loops exist, and each one's policy, is declared in ``app/ops/loop_registry.py``.

The rows are best-effort bookkeeping; losing them only allows one extra (idempotent) pass.
They also say when each loop last ran, which ``/readyz``, the metrics and the local ticker read.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Final, Protocol

from sqlalchemy import and_, or_, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from app.storage.db import as_utc, db_now, loop_runs, transaction

log = logging.getLogger("receipt.loops")
passes = logging.getLogger("receipt.loops.passes")  # app.ops.logs.TICK_PASSES

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


class LoopClaimLost(Exception):
    """This pass no longer holds its loop (it stalled past its claim's deadline): stop."""


class Clock(Protocol):
    """Time as a pass sees it: a monotonic reading, and a callback after a delay (tests advance it)."""

    def monotonic(self) -> float: ...

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> Callable[[], None]:
        """Run ``fn`` once ``delay_s`` from now; returns what cancels it."""
        ...


class SystemClock:
    """``time.monotonic`` and a daemon ``threading.Timer``."""

    def monotonic(self) -> float:
        return time.monotonic()

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> Callable[[], None]:
        timer = threading.Timer(delay_s, fn)
        timer.daemon = True
        timer.start()
        return timer.cancel


SYSTEM_CLOCK: Final = SystemClock()


@dataclass(frozen=True)
class Policy:
    """How one pass holds its loop.

    ``ttl_ms``: the claim's deadline, pushed forward while the pass lives. ``spacing_ms``: a pass
    starting sooner than this after the previous one is a duplicate tick and is skipped.
    ``holds``: True renews the claim from a background thread until the pass settles, so a slow pass
    keeps ownership; False renews it only when the pass reaches an item boundary (``KeepAlive``),
    so a pass stalled inside one item loses the loop on its deadline and another may run.
    ``slow_after_ms``: an observational deadline: past it the pass logs ``slow_event`` and runs on.
    """

    ttl_ms: int
    spacing_ms: int
    holds: bool = False
    slow_after_ms: int | None = None
    slow_event: str = ""


class KeepAlive:
    """Called by a pass between items: renews its claim once a third of the deadline has gone by,
    and raises ``LoopClaimLost`` once the claim is gone.

    With ``renews=False`` (a background ``Renewal`` renews) it only raises once that renewal found
    the claim lost."""

    def __init__(
        self,
        engine: Engine,
        name: str,
        owner: str,
        ttl_ms: int,
        *,
        clock: Clock = SYSTEM_CLOCK,
        renews: bool = True,
    ) -> None:
        self._engine, self._name, self._owner, self._ttl_ms = engine, name, owner, ttl_ms
        self._clock, self._renews = clock, renews
        self._last = clock.monotonic()
        self.lost = threading.Event()

    def __call__(self) -> None:
        if self.lost.is_set():
            raise LoopClaimLost(self._name)
        if not self._renews or (self._clock.monotonic() - self._last) * 1000 < self._ttl_ms / 3:
            return
        if not renew(self._engine, self._name, self._owner, self._ttl_ms):
            self.lost.set()
            raise LoopClaimLost(self._name)
        self._last = self._clock.monotonic()


class Renewal:
    """Renews a held claim from a background thread while its pass runs.

    The thread dies with its process, so a SIGKILLed pass stops renewing and its claim lapses on
    its deadline; a pass whose database went away cannot renew either, with the same result.
    """

    def __init__(self, keep: KeepAlive, engine: Engine, name: str, owner: str, ttl_ms: int) -> None:
        self._keep, self._engine, self._name, self._owner, self._ttl_ms = keep, engine, name, owner, ttl_ms
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"renew-{name}", daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._ttl_ms / 3000):
            try:
                if not renew(self._engine, self._name, self._owner, self._ttl_ms):
                    log.warning("%s: the pass lost its claim; it is no longer renewed", self._name)
                    self._keep.lost.set()
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


# What a pass's wrapper reports besides the pass's own result.
SKIPPED: Final = "skipped"
LOST: Final = "lost"
RAN: Final = "ran"


@dataclass(frozen=True)
class Outcome:
    """One attempt at a pass: ``ran`` (with its result), ``skipped`` (another pass holds or just
    ran the loop) or ``lost`` (the pass stalled past its deadline and stopped)."""

    kind: str
    result: dict[str, Any]
    elapsed_ms: int = 0


def owner_id() -> str:
    """Who holds a claim: host, process and thread, so two threads of one process never share one."""
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


def run_claimed(
    engine: Engine,
    name: str,
    policy: Policy,
    body: Callable[[KeepAlive], dict[str, Any]],
    *,
    clock: Clock = SYSTEM_CLOCK,
) -> Outcome:
    """The one claim-and-renew wrapper every loop pass runs in: claim, renew, observe, release.

    An exception from ``body`` other than ``LoopClaimLost`` propagates after the release is tried
    (a pass cut from its database cannot release either; its deadline frees the loop)."""
    owner = owner_id()
    if not claim(engine, name, owner, min_interval_ms=policy.spacing_ms, ttl_ms=policy.ttl_ms):
        return Outcome(SKIPPED, {"skipped": True})
    started = clock.monotonic()
    slow = policy.slow_after_ms
    cancel_watch: Callable[[], None] | None = None
    if slow is not None:
        # Observational only: say so when the deadline passes, and let the pass run on.
        def said_slow() -> None:
            log.warning("%s: %s pass still running after %d ms", policy.slow_event, name, slow)

        cancel_watch = clock.call_later(slow / 1000, said_slow)
    keep = KeepAlive(engine, name, owner, policy.ttl_ms, clock=clock, renews=not policy.holds)
    # Inside the claim: these two lines never interleave with another pass's (single flight), and
    # they say what Celery's "succeeded" line does not show (it logs no return values). One pair
    # per tick: DEBUG (RECEIPT_LOG_TICKS shows them), and receipt_loop_passes_total counts them.
    passes.debug("loop %s: pass started", name)
    try:
        if policy.holds:
            with Renewal(keep, engine, name, owner, policy.ttl_ms):
                result = body(keep)
        else:
            result = body(keep)
        kind = RAN
    except LoopClaimLost:
        log.warning("%s pass lost its claim (stalled past its deadline); stopping it", name)
        result, kind = {"lost": True}, LOST
    finally:
        if cancel_watch is not None:
            cancel_watch()
        passes.debug("loop %s: pass finished", name)
        try:
            release(engine, name, owner)
        except Exception as exc:  # the database may be what ended the pass: the deadline frees it
            log.warning("could not release %s (%s); its claim lapses on its deadline", name, exc)
    elapsed_ms = round((clock.monotonic() - started) * 1000)
    if slow is not None and elapsed_ms > slow:
        log.warning("%s: %s pass took %d ms (timeout %d ms)", policy.slow_event, name, elapsed_ms, slow)
    return Outcome(kind, result, elapsed_ms)


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


# -- when a loop is overdue --------------------------------------------------------------------------

STALE_FACTOR = 3  # /readyz: a loop whose last run is older than 3 intervals is overdue


def overdue(
    last: datetime | None, since: datetime, now: datetime, interval_ms: int, factor: int = STALE_FACTOR
) -> bool:
    """Pure rule: a loop is overdue when its last pass started more than 3 (``factor``) intervals ago.

    A loop that never ran counts from ``since`` (the observing process's start), so a fresh
    deployment gets the same grace before anything is called overdue.
    """
    reference = last if last is not None else since
    return now - reference > timedelta(milliseconds=factor * interval_ms)
