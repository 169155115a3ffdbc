"""One attempt of one job, as the worker runs it (spec: "Worker executes and settles").

Lease if ``queued`` (redelivered work takes a start-fence heartbeat instead; a mismatch ends
the attempt ``lease_lost``), check ``abortRequested``, run the handler racing the heartbeat loop
and the execution timeout, re-read the job, then complete / fail / cancel it under the attempt
fence. Every write passes the fence (worker id + attempt), so a duplicate or superseded delivery
is inert. Celery only calls ``run_attempt``; nothing here knows about it.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.trace import StatusCode

from app import tracing
from app.config import Settings
from app.dispatch import limits
from app.jobs.errors import no_handler_message
from app.jobs.liveness import FENCED
from app.jobs.reducer import Job
from app.jobs.timing import JobTiming, retry_delay_ms, timing_for
from app.jobs.vocab import AttemptStatus, FailureStatus, ReleaseReason
from app.ops import logs
from app.ops.shutdown import PROCESS, SHUTDOWN, Shutdown
from app.redaction import redactor
from app.storage.concurrency_keys import KeyFull
from app.storage.queue import AttemptStart, Known, Queue
from app.storage.retry import retry_transient
from workers import liveness
from workers.handler import HandlerError, JobContext
from workers.handler_pool import HandlerPool, HandlerRun
from workers.registry import HandlerRegistry

log = logging.getLogger("receipt.worker")

ABORT_POLL_S = 1.0  # how often a running attempt looks for an abort between heartbeats
CANCEL_GRACE_S = 5.0  # how long a cancelled handler gets to stop before the attempt settles anyway
# How long a handler interrupted from outside (its command died of a signal) waits to learn whether
# its process is shutting down: a platform signals every process of a dyno at once, and the command
# may die a moment before the worker's own signal handler has run.
INTERRUPTED_WAIT_S = 1.0


@dataclass(frozen=True)
class AttemptResult:
    """What an attempt ended as: ``completed`` or one of the spec's failure statuses; or, for an
    attempt its concurrency key kept from starting, ``concurrency_limited`` (nothing was written)."""

    status: AttemptStatus | KeyFull
    job: Job | None
    error: str | None = None


def new_worker_id(settings: Settings) -> str:
    """A lease holder id unique to one execution, so a duplicate delivery can never pass the fence."""
    live = liveness.current()
    if live is not None:  # the process's liveness identity, so its death expires the lease
        return live.holder_id()
    base = settings.worker_id or f"{socket.gethostname()}:{os.getpid()}"
    return f"{base}:{uuid.uuid4().hex[:8]}"


# One per process: handler threads are reused from one attempt to the next.
_HANDLERS = HandlerPool()


@dataclass(frozen=True)
class Attempt:
    """One delivered attempt of one job: where it writes, whose lease it holds, under which fence."""

    queue: Queue
    settings: Settings
    job_id: str
    worker_id: str
    number: int
    # Which charged attempt this is (``number`` less the attempts handed back uncharged): the
    # retry backoff grows with it, as the budget does.
    charged: int | None = None
    # The head the lease wrote: the settlement is decided on it, with no read, unless it moved.
    known: Known | None = None

    def settle(
        self,
        *,
        result: Any = None,
        error: str | None = None,
        retryable: bool = True,
        status: FailureStatus | None = None,
    ) -> AttemptResult:
        """Settle under the fence; the attempt's status follows what the receipt actually did.

        The error text is stored in a receipt and shown by the API: a secret a handler's exception
        quoted (a URL's token) is hidden first.
        """
        if error:
            error = redactor(self.settings)(error)
        charged = self.number if self.charged is None else self.charged
        delay = retry_delay_ms(charged, self.settings) if status is not None and retryable else 0
        out = retry_transient(
            lambda: self.queue.settle_attempt(
                self.job_id,
                self.worker_id,
                self.number,
                result=result,
                error=error,
                retryable=retryable,
                status=status,
                retry_delay_ms=delay,
                known=self.known,
            )
        )
        if not out.applied:
            return AttemptResult("settlement_conflict", out.job, "lease no longer held at settlement")
        if out.job.status == "canceled":
            return AttemptResult("canceled", out.job, out.job.abort_reason)
        if status is None:
            return AttemptResult("completed", out.job)
        # Spec: the worker's return value carries the failure status whether or not the receipt does.
        return AttemptResult(status, out.job, error)

    def release(self, reason: ReleaseReason = SHUTDOWN) -> AttemptResult:
        """Hand the attempt back uncharged (``job.released``): queued again now, its delivery settled
        in the same statement, and the scanner woken after the commit (the queue's dispatch hook)."""
        out = retry_transient(lambda: self.queue.release(self.job_id, self.worker_id, self.number, reason))
        if not out.applied:
            return AttemptResult("settlement_conflict", out.job, "lease no longer held at release")
        if out.job.status == "canceled":
            return AttemptResult("canceled", out.job, out.job.abort_reason)
        log.info("attempt %s of %s handed back (%s)", self.number, self.job_id, reason)
        return AttemptResult("released", out.job, reason)


@dataclass(frozen=True)
class Started:
    """An attempt whose first write took the lease (or the start-fence heartbeat): it runs next."""

    attempt: Attempt
    job: Job
    # When its first write began (ns since the epoch): the start of the attempt's span.
    began_ns: int = 0


def lease_ms_for(settings: Settings) -> Callable[[Job], int]:
    """The lease an attempt takes on the job as read (its timing depends on kind and payload)."""

    def lease_ms(job: Job) -> int:
        return timing_for(job.agent_id, job.kind, job.payload, settings).lease_ms

    return lease_ms


def key_limit_for(settings: Settings) -> Callable[[Job], int]:
    """The concurrency limit of the job's key as read: the operator's prefix, else its own, else 1."""

    def key_limit(job: Job) -> int:
        key = job.flow.concurrency_key
        return (
            limits.concurrency_limit(settings.concurrency_limits, key, job.flow.concurrency_limit)
            if key
            else 1
        )

    return key_limit


def begun(this: Attempt, start: AttemptStart, began_ns: int = 0) -> Started | AttemptResult:
    """What an attempt's first write means: it runs (``Started``), or it ends here and why."""
    if start.job is None:
        return AttemptResult("stale_attempt", None, f"no job {this.job_id}")
    job = start.job
    if start.status == "stale_attempt":
        return AttemptResult(
            "stale_attempt", job, f"fence is for attempt {this.number}, job is at {job.attempt}"
        )
    if start.status != "started":
        return AttemptResult(start.status, job)
    return Started(dataclasses.replace(this, charged=job.charged_attempts, known=start.known), job, began_ns)


def run_attempt(
    queue: Queue,
    settings: Settings,
    registry: HandlerRegistry,
    job_id: str,
    attempt: int,
    *,
    worker_id: str | None = None,
    shutdown: Shutdown = PROCESS,
) -> AttemptResult:
    """One delivered attempt: its first write (``start_attempt``), then ``run_started``."""
    worker_id = worker_id or new_worker_id(settings)
    logs.update_job(workerId=worker_id, attempt=attempt)
    this = Attempt(queue, settings, job_id, worker_id, attempt)
    began_ns = time.time_ns()
    # One transaction reads the job and leases it (queued → leased → running in one commit), or
    # takes the start-fence heartbeat of redelivered work; it says why when it did neither.
    start = retry_transient(
        lambda: queue.start_attempt(
            job_id, worker_id, attempt, lease_ms_for(settings), key_limit_for(settings)
        )
    )
    if start.job is not None:
        logs.update_job(org=start.job.organization_id)
    outcome = begun(this, start, began_ns)
    if isinstance(outcome, AttemptResult):
        return outcome
    return run_started(outcome, registry, shutdown)


def lease_attempts(
    queue: Queue, settings: Settings, attempts: Sequence[tuple[str, int]], worker_ids: Sequence[str]
) -> list[Started | AttemptResult | Exception]:
    """The first writes of several delivered attempts (job id, attempt number) in one statement and
    one commit (``Queue.start_attempts``), each under its own fence; each answer as ``begun`` gives
    it. Raises when the statement fails: then no attempt of them holds a lease. An attempt whose own
    decision raised answers with that exception (nothing was written for it)."""
    items = [
        (job_id, worker_id, number) for (job_id, number), worker_id in zip(attempts, worker_ids, strict=True)
    ]
    began_ns = time.time_ns()
    starts = retry_transient(
        lambda: queue.start_attempts(items, lease_ms_for(settings), key_limit_for(settings))
    )
    out: list[Started | AttemptResult | Exception] = []
    for (job_id, worker_id, number), start in zip(items, starts, strict=True):
        if isinstance(start, Exception):
            out.append(start)
        else:
            out.append(begun(Attempt(queue, settings, job_id, worker_id, number), start, began_ns))
    return out


def run_started(started: Started, registry: HandlerRegistry, shutdown: Shutdown = PROCESS) -> AttemptResult:
    """The rest of an attempt that holds its lease: abort check, the handler raced against the
    heartbeat loop and the execution timeout, then the settlement under the attempt fence.

    With tracing on, the attempt is a span in the job's trace from its lease to its settlement
    (``receipt.attempt``, linked to the attempt before it), and the handler's run a child of it."""
    if not tracing.on():
        return _run_started(started, registry, shutdown)
    this, job = started.attempt, started.job
    attributes = {
        tracing.JOB_ID: job.id,
        tracing.ORGANIZATION: job.organization_id or "",
        tracing.AGENT: job.agent_id,
        tracing.KIND: job.kind,
        tracing.ATTEMPT: this.number,
        tracing.WORKER_ID: this.worker_id,
    }
    span = tracing.start_attempt_span(
        job.id, job.trace_context, this.number, attributes, started.began_ns or time.time_ns()
    )
    with trace.use_span(span, end_on_exit=True):
        result = _run_started(started, registry, shutdown)
        span.set_attribute(tracing.OUTCOME, result.status)
        if result.status != "completed":
            span.set_status(StatusCode.ERROR, result.error or result.status)
        return result


def _handler_run(handler: Any, ctx: JobContext) -> Callable[[], Any]:
    """The handler's call, on a thread of the pool; with tracing on, in a ``receipt.handler`` span
    under the attempt's."""
    if not tracing.on():
        return lambda: handler(ctx)
    parent = otel_context.get_current()

    def run() -> Any:
        with tracing.tracer().start_as_current_span(
            "receipt.handler", context=parent, attributes={tracing.AGENT: ctx.job.agent_id}
        ):
            return handler(ctx)

    return run


def _run_started(started: Started, registry: HandlerRegistry, shutdown: Shutdown) -> AttemptResult:
    this, job = started.attempt, started.job
    queue, settings, job_id = this.queue, this.settings, this.job_id
    worker_id, attempt = this.worker_id, this.number
    timing = timing_for(job.agent_id, job.kind, job.payload, settings)

    handler = registry.get(job.agent_id)
    if job.abort_requested or handler is None:
        # settle() cancels when an abort is pending, so a job aborted before it ran never runs.
        return this.settle(error=no_handler_message(job.agent_id), retryable=False, status="failed")

    ctx = JobContext(queue, job, worker_id, attempt, settings, timing.execution_timeout_ms, shutdown)
    liveness.track(ctx)
    thread = _HANDLERS.submit(_handler_run(handler, ctx))
    stop = _race(this, ctx, thread, timing, shutdown)
    if stop == FENCED:
        # This process fenced itself (its liveness lapsed): the job is the worker-liveness loop's
        # to expire, so nothing is written, whatever the handler returns.
        thread.join(CANCEL_GRACE_S)
        return AttemptResult("lease_lost", None, "this worker fenced itself: liveness not renewed")
    if stop == "lease_lost":
        return AttemptResult("lease_lost", queue.get(job_id), "lease lost while running")
    if stop == SHUTDOWN:
        # Past the finish window: whatever the cancelled handler returns, the attempt is handed
        # back; what it saved with ctx.progress is what the next attempt reads.
        thread.join(shutdown.plan.handler_stop_ms / 1000)
        return this.release()
    if stop is not None:
        thread.join(CANCEL_GRACE_S)
    # Every settlement below re-reads the job under the attempt fence inside its transaction and
    # cancels instead when an abort arrived meanwhile.
    if stop == "execution_timeout":
        return this.settle(
            retryable=True,
            status="execution_timeout",
            error=f"execution timed out after {timing.execution_timeout_ms} ms",
        )
    if isinstance(thread.error, HandlerError):
        err = thread.error
        if err.interrupted and shutdown.wait(INTERRUPTED_WAIT_S):
            # Its command died of the platform's own SIGTERM, sent to every process at once: a
            # shutdown, not a failure of the job.
            return this.release()
        return this.settle(error=err.message, retryable=err.retryable, status=err.status, result=err.result)
    if thread.error is not None:
        log.error("handler for %s raised", job_id, exc_info=thread.error)
        return this.settle(
            error=f"{type(thread.error).__name__}: {thread.error}", retryable=True, status="failed"
        )
    return this.settle(result=thread.result)


def _race(
    this: Attempt, ctx: JobContext, thread: HandlerRun, timing: JobTiming, shutdown: Shutdown
) -> str | None:
    """Wait for the handler while heartbeating, watching for abort, the execution timeout and the
    end of a shutdown's finish window.

    Returns None when the handler finished on its own, else why it was stopped.
    """
    queue = this.queue
    started = time.monotonic()
    next_beat = started + timing.heartbeat_interval_ms / 1000
    deadline = started + timing.execution_timeout_ms / 1000
    while True:
        now = time.monotonic()
        to_cancel = shutdown.seconds_to_cancel()
        wait = min(ABORT_POLL_S, next_beat - now, deadline - now)
        if to_cancel is not None:
            wait = min(wait, to_cancel)
        thread.join(max(0.0, wait))
        if ctx.cancel_reason == FENCED:
            return FENCED
        if not thread.is_alive():
            return None
        if shutdown.cancel_due():
            ctx.cancel(SHUTDOWN)
            return SHUTDOWN
        now = time.monotonic()
        if now >= deadline:
            ctx.cancel("execution_timeout")
            return "execution_timeout"
        job: Job | None
        if now >= next_beat:
            next_beat = now + timing.heartbeat_interval_ms / 1000
            try:
                beat = queue.heartbeat(this.job_id, this.worker_id, this.number, timing.lease_ms)
            except Exception as exc:  # a missed beat is survivable: the lease has two more chances
                log.warning("heartbeat for %s failed: %s", this.job_id, exc)
                continue
            if not beat.applied:
                ctx.cancel("lease_lost")
                return "lease_lost"
            job = beat.job
        else:
            try:
                job = queue.get(this.job_id)
            except Exception as exc:
                log.warning("abort poll for %s failed: %s", this.job_id, exc)
                continue
        if job is not None and job.abort_requested:
            ctx.cancel(job.abort_reason or "abort")
            return "abort"
