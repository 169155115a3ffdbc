"""The worker message: run one attempt and settle its delivery record.

Callbacks need nothing here: a terminal settlement writes its outbox rows in its own transaction.
"""

from __future__ import annotations

import logging
from typing import Any

from app.storage.delivery import parse_fence
from tasks.dispatch import settle_delivery
from tasks.runtime import Runtime
from workers.runner import run_attempt

log = logging.getLogger("receipt.execute")

# Outcomes in which this delivery did not own the job (a duplicate or superseded message):
# its delivery record is left to the attempt that does own it, and no callback is posted.
NOT_OWNED = frozenset({"lease_lost", "stale_attempt", "terminal_state"})


def execute(rt: Runtime, job_id: str, fence: str, dispatch_key: str, generation: int) -> dict[str, Any]:
    fenced_job, attempt = parse_fence(fence)
    if fenced_job != job_id:
        return {"status": "stale_attempt", "error": f"fence {fence} is not for job {job_id}"}
    result = run_attempt(rt.queue, rt.settings, rt.registry, job_id, attempt)
    job = result.job
    # Celery's own "succeeded" line does not show the return value (tasks/redaction.py): the
    # outcome, a vocabulary word, is logged here instead, never the job's payload or result.
    log.info("delivery %s: %s", fence, result.status)
    if result.status not in NOT_OWNED:
        # A receipt that takes the job to a terminal state or back to queued settles every pending
        # delivery of the job in its own transaction (Queue.mutate): only an attempt that ended
        # without one (a settlement conflict) still has its delivery to settle here.
        if job is None or not (job.terminal or job.status == "queued"):
            settle_delivery(rt, job_id, dispatch_key, generation, result.status)
        if job is not None and job.status == "queued":
            # A retryable failure requeued the job. The queue's own wake-up fired inside that
            # settlement, while this delivery was still pending, so the starter may have answered
            # active_delivery and left the retry to the queued redrive (min age 30 s). Wake again
            # now that the delivery is settled; if the first wake won, this one is a no-op.
            try:
                rt.delivery.wake([job])
            except Exception:  # best-effort, like every wake-up: the queued redrive still delivers it
                log.exception("could not wake the dispatcher for retry of %s", job_id)
    elif result.status == "terminal_state":
        settle_delivery(rt, job_id, dispatch_key, generation, result.status)
    return {"status": result.status, "jobStatus": job.status if job else None, "error": result.error}
