"""The beat-scheduled recovery loops: queued-job redrive and lease expiry.

Both are idempotent (every write is decided from receipts and fenced) and single-flight (a
``loop_runs`` claim), so two beats running by mistake do no harm.
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from app.ops import logs, metrics
from app.storage import delivery, loops
from app.storage.db import db_now
from tasks.dispatch import start_driver
from tasks.runtime import Runtime

log = logging.getLogger("receipt.loops")

REDRIVE_LOOP = "queued-redrive"
RETRY_LOOP = "due-retries"
EXPIRY_LOOP = "lease-expiry"
SCAN_LIMIT = 500


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _guarded(rt: Runtime, name: str, interval_ms: int, body: Any) -> dict[str, Any]:
    owner = _owner()
    # Half an interval of spacing: duplicate ticks (two beats) collapse into one pass, while a
    # normal schedule with jitter still runs every tick. A pass that died is stale after ten intervals.
    if not loops.claim(rt.engine, name, owner, min_interval_ms=interval_ms // 2, stale_ms=interval_ms * 10):
        return {"skipped": True}
    # Inside the claim: these two lines never interleave with another pass's (single flight), and
    # they say what Celery's "succeeded" line no longer shows (it logs no return values).
    log.info("loop %s: pass started", name)
    try:
        result: dict[str, Any] = body()
        return result
    finally:
        log.info("loop %s: pass finished", name)
        loops.release(rt.engine, name, owner)


def redrive_queued(rt: Runtime) -> dict[str, Any]:
    """Re-deliver queued jobs older than the minimum age, at most once per cooldown per job.

    The dispatch key ``<jobId>:redrive:<seq>:<status>`` makes a pass idempotent for one observed
    queue state: the same state is never delivered twice while its delivery is pending.
    """
    s = rt.settings

    def body() -> dict[str, Any]:
        started = []
        for job, _since in rt.queue.queued_older_than(s.queued_redrive_min_age_ms, limit=SCAN_LIMIT):
            with rt.engine.connect() as conn:
                now = db_now(conn)
                last = delivery.last_started_at(conn, job.id)
            if last is not None and (now - last).total_seconds() * 1000 < s.queued_redrive_cooldown_ms:
                continue
            try:
                with logs.bind_job(jobId=job.id, org=job.organization_id):
                    decision = start_driver(rt, job.id, delivery.redrive_key(job.id, job.seq, job.status))
            except Exception:
                log.exception("redrive of %s failed; next pass retries", job.id)
                continue
            if decision is not None and decision.created:
                started.append(job.id)
        if started:
            log.info("redrive started %d deliveries", len(started))
            metrics.registry_metrics().redrives.inc(len(started))
        return {"redriven": started}

    return _guarded(rt, REDRIVE_LOOP, s.queued_redrive_interval_ms, body)


def expire_leases(rt: Runtime) -> dict[str, Any]:
    """Append ``job.lease_expired`` for every lease past its deadline (database clock)."""

    def body() -> dict[str, Any]:
        expired = rt.queue.expire_leases(limit=SCAN_LIMIT)
        for job in expired:
            if job.status == "failed":
                rt.callbacks.post("failed", job)
        if expired:
            log.info("expired %d leases", len(expired))
        return {"expired": [j.id for j in expired]}

    return _guarded(rt, EXPIRY_LOOP, rt.settings.lease_expiry_interval_ms, body)


def dispatch_due_retries(rt: Runtime) -> dict[str, Any]:
    """Start delivery of every retry whose backoff has passed (``availableAt`` ≤ database now)."""

    def body() -> dict[str, Any]:
        started = []
        for job in rt.queue.due_retries(limit=SCAN_LIMIT):
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
