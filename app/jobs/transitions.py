"""Every job transition Receipt performs, as a named pure function of the job and the clock.

Each function takes the job as read (its projection row, which equals its fold), the database
clock and its own arguments, and returns the receipts to append: a list of events (empty when the
transition does not apply, e.g. a superseded attempt's heartbeat), or raises the refusal the
caller must see (``ConflictError``, ``TooManyCommands``). The guard is in the name where it helps
(Oban's engine callbacks, River's ``JobSetState*``): ``heartbeat_holder`` applies only for the
lease holder, ``lease_queued`` only to a queued job. No I/O: ``app/storage/queue.py`` reads the
job, calls one of these, and appends what it returns in one statement or transaction; a new id a
receipt needs (a command's) is passed in. ``tests/unit/test_transitions.py`` tests them alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Literal

from app.jobs.errors import SINGLETON_CANCEL_REASON, ConflictError, TooManyCommands
from app.jobs.flow import DEBOUNCED_REASON, REPLACED_BY_FIELD
from app.jobs.reducer import OPERATION_ID_FIELD, Job
from app.jobs.times import iso, parse_iso
from app.jobs.vocab import LEASED_STATUSES, CommandLane, EventType, FailureStatus, ReleaseReason

Event = tuple[EventType, dict[str, Any]]

AttemptStartStatus = Literal[
    "started", "terminal_state", "stale_attempt", "lease_lost", "concurrency_limited"
]


def deadline(now: datetime, ms: int) -> str:
    """A lease or retry deadline ``ms`` after ``now``, as receipts write it."""
    return _iso(now + timedelta(milliseconds=ms))


def _iso(value: datetime) -> str:
    text = iso(value)
    assert text is not None
    return text


def _fence(worker_id: str, attempt: int | None) -> dict[str, Any]:
    return {"workerId": worker_id, "attempt": attempt}


# -- the worker's attempt (fenced by worker id and attempt) --------------------------------------


def lease_queued(
    job: Job, now: datetime, worker_id: str, lease_ms: int, *, start: bool = False
) -> list[Event]:
    """Take the lease of a queued job (spec invariant 1: only a queued job is leased). ``start``
    also appends the first heartbeat, so the job goes queued → leased → running at once."""
    if job.status != "queued":
        return []
    fence = {**_fence(worker_id, job.attempt + 1), "expiresAt": deadline(now, lease_ms)}
    events: list[Event] = [("job.leased", fence)]
    if start:
        events.append(("job.heartbeat", dict(fence)))
    return events


@dataclass(frozen=True)
class AttemptStart:
    """What a delivered attempt's first write must be: its verdict, and the receipts if ``started``."""

    status: AttemptStartStatus
    events: tuple[Event, ...] = ()


def start_attempt(job: Job, now: datetime, worker_id: str, attempt: int, lease_ms: int) -> AttemptStart:
    """Spec step 5: a queued job is leased (with the first heartbeat); work redelivered rather than
    leased here takes a start-fence heartbeat, and one that does not match the current fence ends
    the attempt as ``lease_lost``; a job already ended is ``terminal_state``; a delivery for an
    attempt the job has moved past is ``stale_attempt``."""
    if job.terminal:
        return AttemptStart("terminal_state")
    fence = {**_fence(worker_id, attempt), "expiresAt": deadline(now, lease_ms)}
    if job.status == "queued":
        if job.attempt + 1 != attempt:
            return AttemptStart("stale_attempt")
        return AttemptStart("started", (("job.leased", fence), ("job.heartbeat", dict(fence))))
    if not job.holds_lease(worker_id, attempt):
        return AttemptStart("lease_lost")
    return AttemptStart("started", (("job.heartbeat", fence),))


def heartbeat_holder(job: Job, now: datetime, worker_id: str, attempt: int, lease_ms: int) -> list[Event]:
    """Renew the lease (and promote leased → running); inert for a superseded attempt (invariant 2)."""
    if not job.holds_lease(worker_id, attempt):
        return []
    return [("job.heartbeat", {**_fence(worker_id, attempt), "expiresAt": deadline(now, lease_ms)})]


def fenced_holder(
    job: Job, worker_id: str, attempt: int | None, type_: EventType, extra: Mapping[str, Any]
) -> list[Event]:
    """An event only the lease holder may append (``job.progress``, ``job.failed``): inert otherwise."""
    if not job.holds_lease(worker_id, attempt):
        return []
    return [(type_, {**_fence(worker_id, attempt), **extra})]


def failure_body(error: Any, *, retryable: bool, status: FailureStatus, result: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"error": error, "retryable": retryable, "status": status}
    if result is not None:
        body["result"] = result
    return body


def fail_queued(job: Job, body: Mapping[str, Any]) -> list[Event]:
    """Fail a job that no attempt holds (a system-level failure of a queued job)."""
    return [("job.failed", dict(body))] if job.status == "queued" else []


def settle_holder(
    job: Job,
    now: datetime,
    worker_id: str,
    attempt: int,
    *,
    result: Any = None,
    error: Any = None,
    retryable: bool = True,
    status: FailureStatus | None = None,
    retry_delay_ms: int = 0,
) -> list[Event]:
    """The lease holder's settlement, decided on the job re-read: cancel (an abort arrived), complete
    (``status`` None) or fail with ``status``. A retryable failure that a retry follows records
    ``retryAt`` (the clock + ``retry_delay_ms``) for the backoff."""
    if not job.holds_lease(worker_id, attempt):
        return []
    fence = _fence(worker_id, attempt)
    if job.abort_requested:
        return [("job.canceled", {**fence, "reason": job.abort_reason})]
    if status is None:
        return [("job.completed", {**fence, "result": result})]
    body: dict[str, Any] = {**fence, **failure_body(error, retryable=retryable, status=status, result=result)}
    if retryable and retry_delay_ms > 0 and job.charged_attempts < job.max_attempts:
        body["retryAt"] = deadline(now, retry_delay_ms)
    return [("job.failed", body)]


def release_holder(job: Job, worker_id: str, attempt: int, reason: ReleaseReason) -> list[Event]:
    """Hand the attempt back uncharged (``job.released``): only the lease holder may, and only while
    it holds the lease, so a release can never move a newer attempt's job (the fence of
    ``job.lease_expired``). An abort that arrived meanwhile still wins: the holder cancels instead."""
    if not job.holds_lease(worker_id, attempt):
        return []
    fence = _fence(worker_id, attempt)
    if job.abort_requested:
        return [("job.canceled", {**fence, "reason": job.abort_reason})]
    return [("job.released", {**fence, "reason": reason})]


def expire_lease(job: Job, now: datetime) -> list[Event]:
    """``job.lease_expired`` when the job's lease deadline has passed (database clock)."""
    if job.status not in LEASED_STATUSES or job.lease is None or job.lease.expires_at is None:
        return []
    expires = parse_iso(job.lease.expires_at)
    if expires is None or expires >= now:
        return []
    lease = job.lease
    return [
        (
            "job.lease_expired",
            {
                **_fence(lease.worker_id, lease.attempt),
                "expiresAt": lease.expires_at,
                "error": "lease expired",
            },
        )
    ]


# -- commands, cancel ----------------------------------------------------------------------------


def command_body(
    command_id: str,
    type_: str,
    payload: Any,
    reason: str | None,
    now: datetime,
    *,
    lane: CommandLane | None = None,
    **extra: Any,
) -> dict[str, Any]:
    """A ``queue.command`` body; ``lane`` (steer or follow_up) for a steer or follow-up, none for an
    abort (``app.jobs.validation.command_lane`` decides it)."""
    body: dict[str, Any] = {"commandId": command_id, "type": type_}
    if lane is not None:
        body["lane"] = lane
    body.update({"payload": payload, "reason": reason, "at": _iso(now)})
    body.update(extra)
    return body


def at_command_cap(job: Job, cap: int) -> bool:
    return len(job.commands) >= cap


def check_command_room(job: Job, cap: int) -> None:
    """``TooManyCommands`` when the job holds ``cap`` commands already: every command is folded into
    the job's state, so without a cap one tenant could grow a job (and every read of it) without
    bound. Cancel is exempt (``cancel``): a job can always be stopped."""
    if at_command_cap(job, cap):
        raise TooManyCommands(
            f"job {job.client_id} already holds {len(job.commands)} queue commands, the most one job "
            f"may hold (RECEIPT_MAX_COMMANDS_PER_JOB={cap})"
        )


def send_command(
    job: Job,
    now: datetime,
    command_id: str,
    type_: str,
    payload: Any,
    reason: str | None,
    *,
    cap: int,
    lane: CommandLane | None = None,
) -> list[Event]:
    """A queue command (steer, follow_up or abort, a steer or follow-up on its ``lane``); a terminal
    job takes none (``ConflictError``)."""
    if job.terminal:
        raise ConflictError(f"job {job.client_id} is {job.status}; it takes no commands")
    check_command_room(job, cap)
    return [("queue.command", command_body(command_id, type_, payload, reason, now, lane=lane))]


def consume_command(job: Job, command_id: str) -> list[Event]:
    """Mark a pending command consumed; a terminal job ignores consumption (the reducer's rule)."""
    if job.terminal or not any(c.id == command_id and not c.consumed for c in job.commands):
        return []
    return [("queue.command.consumed", {"commandId": command_id})]


def cancel(job: Job, now: datetime, command_id: str, reason: str | None, *, cap: int) -> list[Event]:
    """A queued job is canceled outright; a leased or running one gets an ``abort`` command (only
    its worker can stop work in flight). A terminal job refuses (``ConflictError``). At the command
    cap, a job that is not yet aborting still takes one abort; one that is takes no more."""
    if job.terminal:
        raise ConflictError(f"job {job.client_id} is already {job.status}")
    if job.status == "queued":
        return [("job.canceled", {"reason": reason})]
    if job.abort_requested and at_command_cap(job, cap):
        return []
    return [("queue.command", command_body(command_id, "abort", None, reason, now))]


def archive_record(job: Job, operation_id: str) -> list[Event]:
    """``job.archived`` for an ended job a bulk archive is about to move out (written before its
    stream is read for the segment, so the archived chain ends with it); nothing for a job that has
    not ended, or already records this operation (a page done again after a crash)."""
    if not job.terminal or job.archived_by == operation_id:
        return []
    return [("job.archived", {OPERATION_ID_FIELD: operation_id})]


def cancel_queued(job: Job, reason: str | None) -> list[Event]:
    """Cancel only a still-queued job (the driver honouring ``abortRequested``)."""
    return [("job.canceled", {"reason": reason})] if job.status == "queued" else []


def debounce_replace(job: Job, replaced_by: str) -> list[Event]:
    """A later enqueue with the job's debounce key replaces it (docs/dispatch.md): a still-queued job
    is canceled with reason ``debounced``, naming the job that takes its place (its client id: the
    two share an organisation). Work already leased or running is never stopped by a debounce."""
    if job.status != "queued":
        return []
    return [("job.canceled", {"reason": DEBOUNCED_REASON, REPLACED_BY_FIELD: replaced_by})]


# -- singleton enqueue (spec: "Singleton semantics") ---------------------------------------------


def singleton_cancel(job: Job, now: datetime, command_id: str, *, cap: int) -> list[Event]:
    """``singletonMode: cancel`` for one active job on the session key: a queued one is canceled,
    a leased or running one gets an ``abort`` carrying ``singleton cancel``."""
    if job.status == "queued":
        return [("job.canceled", {"reason": SINGLETON_CANCEL_REASON})]
    if job.abort_requested and at_command_cap(job, cap):
        return []
    return [("queue.command", command_body(command_id, "abort", None, SINGLETON_CANCEL_REASON, now))]


def singleton_steer(
    target: Job,
    now: datetime,
    command_id: str,
    payload: Mapping[str, Any],
    session_key: str,
    from_job_id: str | None,
    *,
    cap: int,
    lane: CommandLane = "steer",
) -> list[Event]:
    """``singletonMode: steer``: the most recent active job on the session key gets a ``steer`` on
    ``lane`` (the lane the enqueue was posted with: ``app.jobs.validation.steer_lane``) carrying the
    new payload, ``fromSessionKey`` and ``fromEnqueue: true`` (and the posted jobId, so a re-post
    finds the steered job instead of steering twice)."""
    check_command_room(target, cap)
    extra: dict[str, Any] = {"fromSessionKey": session_key, "fromEnqueue": True}
    if from_job_id is not None:
        extra["fromJobId"] = from_job_id
    body = command_body(command_id, "steer", dict(payload), None, now, lane=lane, **extra)
    return [("queue.command", body)]


def steered_by(jobs: Sequence[Job], from_job_id: str) -> Job | None:
    """The job an earlier steer enqueue posted as ``from_job_id`` steered (newest first), if any."""
    for job in jobs:
        if any(c.extra.get("fromJobId") == from_job_id for c in job.commands):
            return job
    return None
