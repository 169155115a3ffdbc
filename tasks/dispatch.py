"""The delivery path: dispatch scan → driver starter → driver → worker message.

Spec steps 2-4. The queued receipt *is* the outbox: every path that makes a job dispatchable
(enqueue, retry, lease expiry, redrive) ends in ``start_driver``. The driver never leases and
never waits for the worker; it reads the job, ends a stale lease, honours an abort, or sends the
worker message under the attempt fence ``<jobId>:attempt:<n>``.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from typing import Any, NotRequired, TypedDict

from app.jobs.errors import STALE_ACTIVE_LEASE_ERROR, DeliveryGenerationsExceeded
from app.jobs.reducer import Job
from app.jobs.routing import DRIVER_QUEUE, route
from app.jobs.timing import timing_for
from app.jobs.vocab import LEASED_STATUSES, AttemptStatus, DeliveryOutcome
from app.storage import delivery
from app.storage.db import db_now, parse_iso, transaction
from app.storage.queue import retry_transient
from tasks.runtime import DRIVER_TASK, EXECUTE_TASK, Runtime

log = logging.getLogger("receipt.dispatch")

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class DriveResult(TypedDict):
    """What one driver pass did (the driver task's return value, for logs and tests)."""

    outcome: DeliveryOutcome
    fence: NotRequired[str]  # when dispatched: the attempt fence the worker message carries
    queue: NotRequired[str]  # when dispatched: the worker group's queue


def dispatch_jobs(rt: Runtime, job_ids: list[str]) -> dict[str, Any]:
    """One scanner pass over the given jobs: start a driver for each (base dispatch key = job id).

    The scan runs on ``receipt-driver`` in the driver role, so the driver it starts runs right
    here (``inline``) instead of costing another broker hop back to the same queue.
    """
    started = []
    for job_id in job_ids:
        decision = start_driver(rt, job_id, job_id, inline=True)
        if decision is not None and decision.created:
            started.append(job_id)
    return {"started": started}


def start_driver(
    rt: Runtime, job_id: str, dispatch_key: str, *, inline: bool = False
) -> delivery.StartDecision | None:
    """The driver starter: record a delivery (or learn one is active), then begin the driver —
    by sending the driver task, or, when the caller already runs in the driver role, in-process."""
    job = rt.queue.get(job_id)
    if job is None or job.status != "queued":
        return None
    timing = timing_for(job.agent_id, job.kind, job.payload, rt.settings)
    try:
        with transaction(rt.engine) as conn:
            now = db_now(conn)
            if not_before(job) > now:
                return None  # still backing off: the due-retries pass starts it when its time comes
            decision = delivery.begin(conn, job_id, dispatch_key, now, timing.driver_timeout_ms)
    except DeliveryGenerationsExceeded as exc:
        log.error("%s", exc)
        out = rt.queue.fail(job_id, None, None, str(exc), retryable=False, status="failed")
        if out.applied:
            rt.callbacks.post("failed", out.job)
        return None
    if not decision.created:
        return decision
    if inline:
        drive(rt, job_id, dispatch_key, decision.generation)
        return decision
    try:
        rt.app.send_task(
            DRIVER_TASK,
            args=[job_id, dispatch_key, decision.generation],
            task_id=decision.task_id,
            queue=DRIVER_QUEUE,
        )
    except Exception:
        # The delivery never left: make it terminal so the next pass may start a new generation.
        log.exception("could not send the driver task for %s", job_id)
        settle_delivery(rt, dispatch_key, decision.generation, "send_failed")
        raise
    return decision


def drive(rt: Runtime, job_id: str, dispatch_key: str, generation: int) -> DriveResult:
    """The driver: decide what this delivery does, from the job's current receipts."""
    job = retry_transient(lambda: rt.queue.get(job_id))
    if job is None or job.terminal:
        settle_delivery(rt, dispatch_key, generation, "terminal_state")
        return {"outcome": "terminal_state"}
    if job.status in LEASED_STATUSES:
        assert job.lease is not None
        deadline = parse_iso(job.lease.expires_at)
        if deadline is not None and deadline < db_now_of(rt):
            # A stale active lease ends the pass: fail that attempt (retryable) so the ordinary
            # redrive path picks the job up again. The delivery is settled *first*: the requeue's
            # wake-up fires inside the failure, and finding this delivery still pending it would
            # answer active_delivery and leave the retry to the queued redrive (min age 30 s).
            settle_delivery(rt, dispatch_key, generation, "stale_active_lease")
            out = retry_transient(
                lambda: rt.queue.fail(
                    job_id,
                    job.lease.worker_id if job.lease else None,
                    job.lease.attempt if job.lease else None,
                    STALE_ACTIVE_LEASE_ERROR,
                    retryable=True,
                    status="lease_lost",
                )
            )
            if out.applied and out.job.status == "failed":
                rt.callbacks.post("failed", out.job)
            return {"outcome": "stale_active_lease"}
        settle_delivery(rt, dispatch_key, generation, "active_lease")
        return {"outcome": "active_lease"}
    if job.abort_requested:
        out = retry_transient(lambda: rt.queue.cancel_queued(job_id, job.abort_reason))
        settle_delivery(rt, dispatch_key, generation, "canceled")
        if out.applied:
            rt.callbacks.post("canceled", out.job)
        return {"outcome": "canceled"}
    # Only a job that is backing off pays for a clock read; every other drive skips it.
    if job.available_at is not None and not_before(job) > db_now_of(rt):
        # A retry still backing off (a redrive raced the due-retries pass): not yet.
        settle_delivery(rt, dispatch_key, generation, "backoff")
        return {"outcome": "backoff"}
    fence = delivery.attempt_fence(job_id, job.attempt + 1)
    queue_name = route(job.agent_id, job.kind).queue
    try:
        rt.app.send_task(
            EXECUTE_TASK, args=[job_id, fence, dispatch_key, generation], task_id=fence, queue=queue_name
        )
    except Exception:
        # The worker message never left: end this delivery so the next pass may start another.
        log.exception("could not send the worker task for %s", job_id)
        settle_delivery(rt, dispatch_key, generation, "send_failed")
        raise
    rt.callbacks.post("dispatched", job)
    return {"outcome": "dispatched", "fence": fence, "queue": queue_name}


def deliver_stale(rt: Runtime, job: Job, min_age_ms: int) -> bool:
    """Start a delivery of a job that has stayed queued ``min_age_ms`` (its wake-up was lost).

    The key ``<jobId>:outbox:<seq>`` names one observed queue state, like the redrive key, so a
    repeated pass over the same state starts nothing new. True when a delivery was started.
    """
    changed = parse_iso(job.updated_at)
    if changed is None or (db_now_of(rt) - changed).total_seconds() * 1000 < min_age_ms:
        return False
    decision = start_driver(rt, job.id, f"{job.id}:outbox:{job.seq}")
    return decision is not None and decision.created


def not_before(job: Job) -> datetime:
    """The earliest time the job may be delivered (its retry backoff), or the epoch."""
    return parse_iso(job.available_at) or EPOCH


def db_now_of(rt: Runtime) -> datetime:
    with rt.engine.connect() as conn:
        return db_now(conn)


def settle_delivery(
    rt: Runtime, dispatch_key: str, generation: int, outcome: DeliveryOutcome | AttemptStatus
) -> None:
    try:
        with transaction(rt.engine) as conn:
            delivery.settle(conn, dispatch_key, generation, outcome, db_now(conn))
    except Exception:  # best-effort bookkeeping: an unsettled delivery only expires later
        log.exception("could not settle delivery %s/%s", dispatch_key, generation)
