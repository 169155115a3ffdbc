"""The Factory's recovery passes: the control outbox redrive, the watchdog tick, resume at startup.

Celery-free: the outbox redrive and the watchdog tick are recovery loops declared in
``app/ops/loop_registry.py`` (their schedule, queue, task and claim policy) and bound to these functions in
``workers/loop_passes.py``, which runs each pass in the one claim-and-renew wrapper
(``app.storage.loop_claims.run_claimed``). Resume at startup runs through the same wrapper here; the web
process starts it from gunicorn's ``post_worker_init`` through ``api/resume.py``.

All three only ever *write requests or enqueue jobs*; objective control decides.

- **Outbox redrive** (every ``RECEIPT_OBJECTIVE_CONTROL_OUTBOX_REDRIVE_INTERVAL_MS``, on the
  ``receipt-objectives`` queue that only ``worker-control`` and ``all`` consume): a control job for
  every unconsumed request that has none. Its claim is held until the pass settles;
  ``RECEIPT_OBJECTIVE_CONTROL_OUTBOX_REDRIVE_TIMEOUT_MS`` is observational: a pass past it keeps
  running (and its claim) and logs ``factory.control_outbox_redrive_slow``; interval ticks
  meanwhile find the claim held and skip.
- **Watchdog tick**: enqueue the cron tick's ``factory.objective.watchdog`` job (one per tick).
- **Resume at startup**: every process role, once, ``RESONATE_STARTUP_SETTLE_MS`` after start,
  writes a ``resume`` request for each active objective, a page at a time. Processes starting
  together coalesce into one pass.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from app.config import Settings
from app.factory import service, sweep, watchdog
from app.jobs.reducer import Job
from app.storage import loop_claims
from app.storage.queue import Queue

log = logging.getLogger("receipt.factory")

RESUME_LOOP = "objective-resume"
SCAN_LIMIT = 500


def outbox_redrive(
    queue: Queue,
    settings: Settings,
    deliver: Callable[[Job, int], bool] | None = None,
    between: Callable[[], None] | None = None,
) -> dict[str, Any]:
    """One outbox redrive pass (run it claimed: ``workers.loop_passes.objective_outbox_redrive``).

    ``deliver(job, age_ms)`` starts delivery of a control job that has waited queued for a whole
    interval (its wake-up was lost with the broker): the outbox owns its requests end to end.
    ``between`` runs before each delivery (the claim's keep-alive).
    """
    interval = settings.objective_control_outbox_redrive_interval_ms
    result = service.redrive_outbox(queue, limit=SCAN_LIMIT, audit_grace_ms=interval)
    waiting = result.pop("waiting")
    kicked = []
    if deliver is not None:
        for job in waiting:
            if between is not None:
                between()
            if deliver(job, interval):
                kicked.append(job.id)
    result["delivered"] = kicked
    if result["controlJobs"] or result["auditJobs"]:
        log.info(
            "outbox redrive: %d control jobs, %d audit jobs",
            len(result["controlJobs"]),
            len(result["auditJobs"]),
        )
    return result


def watchdog_tick(queue: Queue, settings: Settings, published: datetime | None) -> dict[str, Any]:
    """The watchdog tick: enqueue the ``factory.objective.watchdog`` job of the tick ``published``
    (beat's publish time; None: now, database clock) belongs to. One job per tick, by its id."""
    if not watchdog.enabled(settings):
        return {"skipped": True}
    result = sweep.enqueue_tick(queue, settings, published)
    log.info("objective watchdog tick: job %s (created=%s)", result.job.id, result.created)
    return {"jobId": result.job.id, "created": result.created}


def resume_once(queue: Queue, settings: Settings) -> dict[str, Any]:
    """Resume every active objective, unless another process's resume holds or just ran the claim."""
    # Processes starting together coalesce into one pass; a restart after that runs its own.
    spacing = settings.startup_settle_ms + 1000
    policy = loop_claims.Policy(ttl_ms=loop_claims.claim_ttl_ms(spacing), spacing_ms=spacing, holds=True)
    outcome = loop_claims.run_claimed(queue.engine, RESUME_LOOP, policy, lambda _keep: _resume(queue))
    return outcome.result


def _resume(queue: Queue) -> dict[str, Any]:
    count = service.resume(queue)
    if count:
        log.info("objective resume: %d active objectives asked to resume", count)
    return {"resumed": count}


def schedule_resume(queue: Queue, settings: Settings, role: str) -> threading.Timer:
    """Run ``resume_once`` once, ``RESONATE_STARTUP_SETTLE_MS`` from now, in the background."""

    def run() -> None:
        try:
            resume_once(queue, settings)
        except Exception:  # a failed resume is retried by the next process start, and the watchdog
            log.exception("objective resume at startup (%s) failed", role)

    timer = threading.Timer(settings.startup_settle_ms / 1000, run)
    timer.daemon = True
    timer.name = "objective-resume"
    timer.start()
    return timer
