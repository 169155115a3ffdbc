"""The recovery loops: queued-job redrive, due retries and lease expiry, and their local ticker.

Every pass is idempotent (every write is decided from receipts and fenced) and single-flight (a
``loop_runs`` claim with a renewed deadline), so two beats running by mistake do no harm, and a
pass that dies frees its loop within about one interval.

Beat schedules the passes. So that recovery does not hang on that one process, every process
that consumes ``receipt-maintenance`` also runs a ``LocalTicker``: when a loop's last run is
older than ``TICKER_FACTOR`` (2) times its interval -- beat is down, or its ticks are lost -- the
ticker runs a pass itself, through the same claim: so it acts before ``/readyz`` would call the
loop overdue (3 intervals).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from app.jobs.routing import DRIVER_QUEUE, QUEUES
from app.ops import logs, metrics
from app.storage import delivery, loops
from app.storage.db import db_now, transaction
from tasks import fetches
from tasks.dispatch import start_driver
from tasks.runtime import Runtime

log = logging.getLogger("receipt.loops")

REDRIVE_LOOP = loops.REDRIVE_LOOP
RETRY_LOOP = loops.RETRY_LOOP
EXPIRY_LOOP = loops.EXPIRY_LOOP
CALLBACK_LOOP = loops.CALLBACK_LOOP
SCAN_LIMIT = 500
STALE_FACTOR = loops.STALE_FACTOR
# The ticker steps in at 2 intervals, before /readyz calls a loop overdue at 3: with beat down, a
# loop's last run then never ages past 3 intervals while a maintenance consumer lives.
TICKER_FACTOR = 2
overdue = loops.overdue


# A claim lives one interval, but never less than 2 s: on a loaded machine one transaction of a
# sub-second loop (lease expiry every 0.5 s in tests) can outlast a shorter deadline.
class LoopClaimLost(Exception):
    """This pass no longer holds its loop (it stalled past its claim's deadline): stop."""


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


class KeepAlive:
    """Renews a pass's claim when a third of its deadline has gone by; raises once it is lost."""

    def __init__(self, rt: Runtime, name: str, owner: str, ttl_ms: int) -> None:
        self._rt, self._name, self._owner, self._ttl_ms = rt, name, owner, ttl_ms
        self._last = _monotonic_ms()

    def __call__(self) -> None:
        if _monotonic_ms() - self._last < self._ttl_ms / 3:
            return
        if not loops.renew(self._rt.engine, self._name, self._owner, self._ttl_ms):
            raise LoopClaimLost(self._name)
        self._last = _monotonic_ms()


def _monotonic_ms() -> float:
    return time.monotonic() * 1000


def _guarded(
    rt: Runtime, name: str, interval_ms: int, body: Callable[[KeepAlive], dict[str, Any]]
) -> dict[str, Any]:
    owner = _owner()
    ttl = loops.claim_ttl_ms(interval_ms)
    # Half an interval of spacing: duplicate ticks (two beats) collapse into one pass, while a
    # normal schedule with jitter still runs every tick.
    if not loops.claim(rt.engine, name, owner, min_interval_ms=interval_ms // 2, ttl_ms=ttl):
        return {"skipped": True}
    # Inside the claim: these two lines never interleave with another pass's (single flight), and
    # they say what Celery's "succeeded" line no longer shows (it logs no return values).
    log.info("loop %s: pass started", name)
    try:
        return body(KeepAlive(rt, name, owner, ttl))
    except LoopClaimLost:
        log.warning("%s pass lost its claim (stalled past its deadline); stopping it", name)
        return {"lost": True}
    finally:
        log.info("loop %s: pass finished", name)
        try:
            loops.release(rt.engine, name, owner)
        except Exception as exc:  # the database may be what killed the pass: the deadline frees it
            log.warning("could not release %s (%s); its claim lapses on its deadline", name, exc)


# A pending delivery is presumed lost (the broker holding no message it could be) only once it is
# this old: between recording a delivery and sending its message, a loaded driver can take seconds.
PRESUME_LOST_AFTER_MS = 5000


def presume_after_ms(cooldown_ms: int) -> int:
    return max(cooldown_ms, PRESUME_LOST_AFTER_MS)


def redrive_queued(rt: Runtime) -> dict[str, Any]:
    """Re-deliver queued jobs older than the minimum age, at most once per cooldown per job.

    The dispatch key ``<jobId>:redrive:<seq>:<status>`` makes a pass idempotent for one observed
    queue state. A job with a delivery in flight gets no second message, unless that delivery is
    known lost (sent to an earlier broker epoch) or presumed lost (the broker holds no message in
    the queues it would be on). The pass also ends delivery records that can no longer matter.
    """
    s = rt.settings

    def body(keep: KeepAlive) -> dict[str, Any]:
        with transaction(rt.engine) as conn:
            swept = delivery.sweep(conn, db_now(conn))
        epoch = rt.broker.epoch()
        # Deliveries whose message died with the process that fetched it end first, so the scan
        # below starts their next generation in this very pass (tasks/fetches.py).
        lost, held = settle_lost_fetches(rt, epoch)
        # With every queue empty, no pending delivery can still have a message waiting: each is
        # presumed lost. Otherwise jobs whose delivery is in flight are left out of the scan.
        drained = rt.broker.queues_empty([DRIVER_QUEUE, *QUEUES.values()]) is True
        started = []
        candidates = rt.queue.queued_older_than(
            s.queued_redrive_min_age_ms, limit=SCAN_LIMIT, skip_in_flight=not drained, epoch=epoch
        )
        for job, _since in candidates:
            keep()
            with rt.engine.connect() as conn:
                now = db_now(conn)
                last = delivery.last_live_start(conn, job.id, epoch)
            if last is not None and (now - last).total_seconds() * 1000 < s.queued_redrive_cooldown_ms:
                continue
            try:
                with logs.bind_job(jobId=job.id, org=job.organization_id):
                    decision = start_driver(
                        rt,
                        job.id,
                        delivery.redrive_key(job.id, job.seq, job.status),
                        # A delivery a live consumer holds is not lost, however empty the queues.
                        presume_lost_after_ms=(
                            presume_after_ms(s.queued_redrive_cooldown_ms)
                            if drained and job.id not in held
                            else None
                        ),
                    )
            except Exception:
                log.exception("redrive of %s failed; next pass retries", job.id)
                continue
            if decision is not None and decision.created:
                started.append(job.id)
        if started:
            log.info("redrive started %d deliveries", len(started))
            metrics.registry_metrics().redrives.inc(len(started))
        return {"redriven": started, "swept": swept, "fetcherLost": lost}

    return _guarded(rt, REDRIVE_LOOP, s.queued_redrive_interval_ms, body)


def settle_lost_fetches(rt: Runtime, epoch: str | None) -> tuple[list[str], set[str]]:
    """Settle ``fetcher_lost`` every pending delivery of a queued job whose message was fetched by
    a process that is no longer alive, or that gave up on it (tasks/fetches.py). Returns those job
    ids, and the jobs whose delivery a live consumer holds right now (never presumed lost). Best
    effort: on a broker error nothing is known and the earlier rules (epoch, presumption, deadline)
    apply."""
    client = rt.broker.client()
    if client is None:
        return [], set()
    with rt.engine.connect() as conn:
        now = db_now(conn)
        rows = delivery.pending_of_queued(conn, now, epoch, SCAN_LIMIT)
    pending = [
        fetches.Pending(r.job_id, r.purpose, r.observed, r.generation, r.task_id, _age_ms(now, r.created_at))
        for r in rows
    ]
    try:
        found = fetches.verdicts(client, pending)
    except Exception as exc:
        log.warning("could not read the fetch records: %s", exc)
        return [], set()
    held = {r.job_id for r, v in zip(rows, found, strict=True) if v == fetches.HELD_ALIVE}
    lost = [r for r, v in zip(rows, found, strict=True) if v == fetches.LOST]
    if lost:
        with transaction(rt.engine) as conn:
            now = db_now(conn)
            for row in lost:
                delivery.settle_fetcher_lost(conn, row, now)
    ids = [r.job_id for r in lost]
    if ids:
        log.warning("%d deliveries lost with their fetcher: %s", len(ids), ", ".join(ids[:20]))
    return ids, held


def _age_ms(now: datetime, then: datetime) -> float:
    return (now - then).total_seconds() * 1000


def expire_leases(rt: Runtime) -> dict[str, Any]:
    """Append ``job.lease_expired`` for every lease past its deadline (database clock)."""

    def body(keep: KeepAlive) -> dict[str, Any]:
        expired = rt.queue.expire_leases(limit=SCAN_LIMIT, between=keep)
        if expired:
            log.info("expired %d leases", len(expired))
        return {"expired": [j.id for j in expired]}

    return _guarded(rt, EXPIRY_LOOP, rt.settings.lease_expiry_interval_ms, body)


def dispatch_due_retries(rt: Runtime) -> dict[str, Any]:
    """Start delivery of every retry whose backoff has passed (``availableAt`` ≤ database now)."""

    def body(keep: KeepAlive) -> dict[str, Any]:
        started = []
        for job in rt.queue.due_retries(limit=SCAN_LIMIT, skip_in_flight=True, epoch=rt.broker.epoch()):
            keep()
            try:
                with logs.bind_job(jobId=job.id, org=job.organization_id):
                    decision = start_driver(rt, job.id, job.id)
            except Exception:
                log.exception("dispatch of due retry %s failed; next pass retries", job.id)
                continue
            if decision is not None and decision.created:
                started.append(job.id)
        return {"started": started}

    return _guarded(rt, RETRY_LOOP, rt.settings.retry_scan_interval_ms, body)


def send_callbacks(rt: Runtime) -> dict[str, Any]:
    """Deliver the callback outbox (tasks/callbacks.py): at least once, signed, in order per job."""
    from tasks.callbacks import Sender, send_due

    sender: Sender | None = getattr(rt, "_sender", None)
    if sender is None:
        sender = Sender(rt.settings)
        rt._sender = sender  # type: ignore[attr-defined]

    def body(keep: KeepAlive) -> dict[str, Any]:
        return send_due(rt.engine, sender, keep)

    return _guarded(rt, CALLBACK_LOOP, rt.settings.callback_send_interval_ms, body)


# -- which loops exist, and the local ticker --------------------------------------------------------


@dataclass(frozen=True)
class LoopSpec:
    """One recovery loop: its ``loop_runs`` name, its interval and its pass."""

    name: str
    interval_ms: Callable[[Runtime], int]
    run: Callable[[Runtime], dict[str, Any]]


LOOPS: tuple[LoopSpec, ...] = (
    LoopSpec(REDRIVE_LOOP, lambda rt: loops.loop_intervals(rt.settings)[REDRIVE_LOOP], redrive_queued),
    LoopSpec(RETRY_LOOP, lambda rt: loops.loop_intervals(rt.settings)[RETRY_LOOP], dispatch_due_retries),
    LoopSpec(EXPIRY_LOOP, lambda rt: loops.loop_intervals(rt.settings)[EXPIRY_LOOP], expire_leases),
    LoopSpec(CALLBACK_LOOP, lambda rt: rt.settings.callback_send_interval_ms, send_callbacks),
)


def loop_specs(rt: Runtime) -> tuple[LoopSpec, ...]:
    """The loops this deployment runs (the callback sender only where callbacks are configured)."""
    names = loops.loop_intervals(rt.settings)
    return tuple(spec for spec in LOOPS if spec.name in names)


class LocalTicker:
    """A daemon thread that runs any overdue loop's pass in this process (beat need not be alive)."""

    def __init__(self, rt: Runtime, specs: tuple[LoopSpec, ...] | None = None) -> None:
        self.rt = rt
        self.specs = specs if specs is not None else loop_specs(rt)
        shortest = min(spec.interval_ms(rt) for spec in self.specs)
        self.tick_s = min(5.0, max(0.2, shortest / 2000))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="receipt-ticker", daemon=True)
        self._since: datetime | None = None
        self.passes = 0

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def tick(self) -> list[str]:
        """One look at ``loop_runs``; runs each overdue loop's pass and returns their names."""
        now, runs = loops.last_runs(self.rt.engine)
        if self._since is None:
            self._since = now
        ran = []
        for spec in self.specs:
            last = runs.get(spec.name)
            interval = spec.interval_ms(self.rt)
            if overdue(last.started_at if last else None, self._since, now, interval, TICKER_FACTOR):
                result = spec.run(self.rt)
                if not result.get("skipped"):
                    log.warning("local ticker ran %s: its last run was overdue (beat down?)", spec.name)
                    ran.append(spec.name)
                    self.passes += 1
        return ran

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.tick()
            except Exception as exc:  # the database may be down: look again next tick
                log.warning("local ticker could not check the loops: %s", exc)
