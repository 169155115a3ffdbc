"""Worker liveness: the pure decisions behind "a dead worker is noticed in seconds, not a lease".

Each worker process renews a liveness record of its own (``app/storage/liveness.py``) every
``RECEIPT_WORKER_LIVENESS_INTERVAL_MS``, apart from the per-job heartbeats. Three numbers decide:

- the process **fences itself** when it has not renewed for ``self_fence_ms`` by its own monotonic
  clock, counted from the *start* of its last successful renewal (``fence_due``): it cancels every
  attempt it runs and kills their commands, and it never renews that identity again;
- the ``worker-liveness`` loop declares it **dead** when its record's last renewal (database clock)
  is older than ``dead_after_ms`` (``lapsed``), and expires the jobs it holds (``expire_held``);
- ``dead_after_ms >= self_fence_ms + FENCE_MARGIN_MS`` (``ordering_errors``), so the command of a
  process that is only cut off is gone before another worker may start the job.

Why the margin is enough (the two clocks never need to agree: each side measures a duration on its
own clock, so only their *rate* differs, by parts per million):

- The renewal's ``renewed_at`` is the database's ``now()`` for a transaction the worker began
  after the instant it counts from, so the database's deadline is never earlier than the worker's.
- ``FENCE_CHECK_MS`` (250): how late the process's watch can notice that its deadline passed.
- ``KILL_BUDGET_MS`` (1 000): cancelling the handlers and SIGKILLing each command's process tree
  (the codex handler polls its cancellation every 50 ms and kills at once on a fence; the sandbox
  reaps the namespace's init, normally within milliseconds).
- ``SCHEDULING_SLACK_MS`` (750): a loaded host's thread scheduling delay and the clock-rate drift.

A process identity is ``<base>:<epoch>`` (``process_id``), ``base`` being ``<host>:<pid>`` (or
``RECEIPT_WORKER_ID``) and ``epoch`` 8 hex digits chosen at start and again after every fence. An
attempt's lease holder id is that identity followed by 8 more hex digits (``holder_id``), so the jobs
a process holds are the leases whose holder id starts with its identity (``held_by``).

Pure: stdlib only; ``now`` is passed in.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any

from app.jobs.reducer import Job
from app.jobs.vocab import LEASED_STATUSES, EventType

Event = tuple[EventType, dict[str, Any]]

FENCE_CHECK_MS = 250
KILL_BUDGET_MS = 1000
SCHEDULING_SLACK_MS = 750
FENCE_MARGIN_MS = FENCE_CHECK_MS + KILL_BUDGET_MS + SCHEDULING_SLACK_MS
# A process must be able to miss one renewal without fencing itself.
MIN_RENEWALS_PER_FENCE = 2
EPOCH_HEX = 8
# The cancellation reason a fenced process's handlers see (``JobContext.cancel_reason``).
FENCED = "worker_fenced"

INTERVAL_ENV = "RECEIPT_WORKER_LIVENESS_INTERVAL_MS"
SELF_FENCE_ENV = "RECEIPT_WORKER_SELF_FENCE_MS"
DEAD_AFTER_ENV = "RECEIPT_WORKER_DEAD_AFTER_MS"


def ordering_errors(interval_ms: int, self_fence_ms: int, dead_after_ms: int) -> list[str]:
    """Why these three settings cannot keep two executions of one job apart (empty: they can)."""
    errors = []
    if interval_ms <= 0:
        errors.append(f"{INTERVAL_ENV}={interval_ms} must be more than 0 milliseconds")
    elif self_fence_ms < MIN_RENEWALS_PER_FENCE * interval_ms:
        errors.append(
            f"{SELF_FENCE_ENV}={self_fence_ms} must be at least {MIN_RENEWALS_PER_FENCE} renewals "
            f"({MIN_RENEWALS_PER_FENCE} x {INTERVAL_ENV}={interval_ms}), "
            "or one late renewal kills every command"
        )
    if dead_after_ms < self_fence_ms + FENCE_MARGIN_MS:
        errors.append(
            f"{DEAD_AFTER_ENV}={dead_after_ms} must be at least {SELF_FENCE_ENV}={self_fence_ms} + "
            f"{FENCE_MARGIN_MS} ms (the time to notice and kill a command), or a cut-off worker's "
            "command may still run when its job starts elsewhere"
        )
    return errors


def fence_due(last_ok_started: float, now: float, self_fence_ms: int) -> bool:
    """True when a process whose last successful renewal *started* at ``last_ok_started`` (its own
    monotonic clock, in seconds) must fence itself at ``now``."""
    return (now - last_ok_started) * 1000 >= self_fence_ms


def lapsed(renewed_at: datetime, now: datetime, dead_after_ms: int) -> bool:
    """True when a record last renewed at ``renewed_at`` is dead at ``now`` (database clock)."""
    return now - renewed_at > timedelta(milliseconds=dead_after_ms)


def lapsed_before(now: datetime, dead_after_ms: int) -> datetime:
    """Records renewed before this instant have lapsed (the query form of ``lapsed``)."""
    return now - timedelta(milliseconds=dead_after_ms)


def process_id(base: str, epoch: str) -> str:
    return f"{base}:{epoch}"


def holder_id(process: str, nonce: str) -> str:
    """The lease holder id of one attempt run by ``process``: its identity, then ``nonce`` (hex)."""
    return f"{process}{nonce}"


def held_by(job: Job, process: str) -> bool:
    """True when ``process`` (an identity from ``process_id``) holds ``job``'s active lease."""
    return (
        job.status in LEASED_STATUSES
        and job.lease is not None
        and job.lease.worker_id.startswith(process)
        and len(job.lease.worker_id) > len(process)
    )


def lapse_error(process: str) -> str:
    return f"worker {process} liveness lapsed"


def expire_held(job: Job, process: str, now: datetime) -> Sequence[Event]:
    """``job.lease_expired`` for a lease held by a process declared dead, whatever its deadline.

    The ordinary expiry receipt, fenced on the lease it was observed on, with the reason in
    ``error``; ``expiresAt`` is the lease's own deadline, which had not passed."""
    if not held_by(job, process):
        return []
    lease = job.lease
    assert lease is not None
    return [
        (
            "job.lease_expired",
            {
                "workerId": lease.worker_id,
                "attempt": lease.attempt,
                "expiresAt": lease.expires_at,
                "error": lapse_error(process),
            },
        )
    ]
