"""The Factory's recovery loops: the control outbox redrive and resume at startup.

Celery-free (``tasks/celery_app.py`` registers the beat task and the worker hook; the web process
starts resume from gunicorn's ``post_worker_init`` through ``api/resume.py``).

Both only ever *write requests or enqueue control jobs*; objective control decides. Both are
single-flight through ``loop_runs`` claims (``app.storage.loops``), so duplicate beats and six
processes starting at once do one pass.

- **Outbox redrive** (beat, every ``RECEIPT_OBJECTIVE_CONTROL_OUTBOX_REDRIVE_INTERVAL_MS``, on the
  ``receipt-objectives`` queue that only ``worker-control`` and ``all`` consume): a control job for
  every unconsumed request that has none. ``RECEIPT_OBJECTIVE_CONTROL_OUTBOX_REDRIVE_TIMEOUT_MS`` is
  observational: a pass past it keeps running (and keeps its claim) and logs
  ``factory.control_outbox_redrive_slow``; interval ticks meanwhile find the claim held and skip.
- **Resume at startup**: every process role, once, ``RESONATE_STARTUP_SETTLE_MS`` after start,
  writes a ``resume`` request for each active objective, a page at a time.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from datetime import UTC, datetime
from typing import Any

from app.config import Settings
from app.factory import service, sweep, watchdog
from app.storage import loops
from app.storage.queue import Queue

log = logging.getLogger("receipt.factory")

OUTBOX_LOOP = "objective-outbox-redrive"
RESUME_LOOP = "objective-resume"
SLOW_EVENT = "factory.control_outbox_redrive_slow"
SCAN_LIMIT = 500


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{threading.get_ident()}"


def outbox_redrive(queue: Queue, settings: Settings, deliver: Any = None) -> dict[str, Any]:
    """One single-flight outbox redrive pass.

    ``deliver(job)`` starts delivery of a control job that has waited queued for a whole interval
    (its wake-up was lost with the broker): the outbox owns its requests end to end.
    """
    interval = settings.objective_control_outbox_redrive_interval_ms
    timeout = settings.objective_control_outbox_redrive_timeout_ms
    owner = _owner()
    ttl = loops.claim_ttl_ms(interval)
    if not loops.claim(queue.engine, OUTBOX_LOOP, owner, min_interval_ms=interval // 2, ttl_ms=ttl):
        return {"skipped": True}
    started = time.monotonic()
    # Observational only: say so when the deadline passes, and let the pass run on.
    watch = threading.Timer(
        timeout / 1000, lambda: log.warning("%s: pass still running after %d ms", SLOW_EVENT, timeout)
    )
    watch.daemon = True
    watch.start()
    # A slow pass keeps ownership by renewing its claim; a dead one frees the loop within an interval.
    try:
        with loops.Renewal(queue.engine, OUTBOX_LOOP, owner, ttl):
            result = service.redrive_outbox(queue, limit=SCAN_LIMIT, audit_grace_ms=interval)
            waiting = result.pop("waiting")
            kicked = []
            if deliver is not None:
                for job in waiting:
                    if deliver(job, interval):
                        kicked.append(job.id)
            result["delivered"] = kicked
    finally:
        watch.cancel()
    elapsed_ms = round((time.monotonic() - started) * 1000)
    if elapsed_ms > timeout:
        log.warning("%s: pass took %d ms (timeout %d ms)", SLOW_EVENT, elapsed_ms, timeout)
    if result["controlJobs"] or result["auditJobs"]:
        log.info(
            "outbox redrive: %d control jobs, %d audit jobs",
            len(result["controlJobs"]),
            len(result["auditJobs"]),
        )
    return {**result, "elapsedMs": elapsed_ms}


def utcnow_iso() -> str:
    return datetime.now(UTC).isoformat()


def watchdog_tick(queue: Queue, settings: Settings, published: str | None) -> dict[str, Any]:
    """Beat's watchdog tick: enqueue the tick's ``factory.objective.watchdog`` job (one per tick)."""
    if not watchdog.enabled(settings):
        return {"skipped": True}
    at = datetime.fromisoformat(published) if published else None
    result = sweep.enqueue_tick(queue, settings, at)
    log.info("objective watchdog tick: job %s (created=%s)", result.job.id, result.created)
    return {"jobId": result.job.id, "created": result.created}


def resume_once(queue: Queue, settings: Settings) -> dict[str, Any]:
    """Resume every active objective, unless another process's resume holds or just ran the claim."""
    owner = _owner()
    # Processes starting together coalesce into one pass; a restart after that runs its own.
    spacing = settings.startup_settle_ms + 1000
    ttl = loops.claim_ttl_ms(spacing)
    if not loops.claim(queue.engine, RESUME_LOOP, owner, min_interval_ms=spacing, ttl_ms=ttl):
        return {"skipped": True}
    with loops.Renewal(queue.engine, RESUME_LOOP, owner, ttl):
        count = service.resume(queue)
    if count:
        log.info("objective resume: %d active objectives asked to resume", count)
    return {"resumed": count}


def schedule_resume(queue: Queue, settings: Settings, role: str) -> threading.Timer:
    """Run ``resume_once`` once, ``RESONATE_STARTUP_SETTLE_MS`` from now, in the background."""

    def run() -> None:
        try:
            resume_once(queue, settings)
        except Exception:  # a failed resume is retried by the next process start; the watchdog (issue 10)
            log.exception("objective resume at startup (%s) failed", role)

    timer = threading.Timer(settings.startup_settle_ms / 1000, run)
    timer.daemon = True
    timer.name = "objective-resume"
    timer.start()
    return timer
