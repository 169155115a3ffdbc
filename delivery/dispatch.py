"""The delivery path: dispatch scan → driver starter → driver → worker message.

Spec steps 2-4. The queued receipt *is* the outbox: every path that makes a job dispatchable
(enqueue, retry, lease expiry, redrive) ends in ``start_driver``. The driver never leases and
never waits for the worker; it reads the job, ends a stale lease, honours an abort, or sends the
worker message under the attempt fence ``<jobId>:attempt:<n>``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NotRequired, TypedDict

from opentelemetry.trace import SpanKind
from sqlalchemy import update

from app import tracing
from app.dispatch import fast, line, policies
from app.jobs.errors import STALE_ACTIVE_LEASE_ERROR, DeliveryGenerationsExceeded
from app.jobs.reducer import Job
from app.jobs.routing import DRIVER_QUEUE, DRIVER_TASK, EXECUTE_BATCH_TASK, EXECUTE_TASK, queue_for, route
from app.jobs.timing import timing_for
from app.jobs.vocab import LEASED_STATUSES, AttemptStatus, DeliveryOutcome
from app.ops import logs, metrics
from app.ops.shutdown import PROCESS
from app.storage import delivery, projection
from app.storage.db import autocommit_connection, db_now, jobs, parse_iso, transaction
from app.storage.retry import retry_transient
from delivery import fetches
from delivery.dispatcher import Dispatcher
from delivery.wakes import LINE_FULL, QUEUE_TOKEN

log = logging.getLogger("receipt.dispatch")

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class DriveResult(TypedDict):
    """What one driver pass did (the driver task's return value, for logs and tests)."""

    outcome: DeliveryOutcome
    fence: NotRequired[str]  # when dispatched: the attempt fence the worker message carries
    queue: NotRequired[str]  # when dispatched: the worker group's queue


# The most jobs one scan transaction claims (its lock statement, read and insert cover them all).
CLAIM_BATCH = 100
# Jobs that join a line whose last pass found no free place take no pass of their own (the next
# freed place's pass weighs them); the process they woke looks at that line within this anyway, so
# one that a concurrent pass emptied meanwhile is not left waiting for a tick.
FULL_LINE_LOOK_S = 0.1


def dispatch_jobs(rt: Dispatcher, job_ids: list[str]) -> dict[str, Any]:
    """One scanner pass: start a driver for each job woken (base dispatch key = job id).

    The jobs come from the wake-up message itself and, with a Redis broker, from the coalesced
    wake list (``delivery/wakes.py``), drained here in batches. Each batch is claimed in one
    transaction (``delivery.begin_many``). The scan runs on ``receipt-driver`` in the driver role,
    so the driver of every claimed job runs right here instead of costing another broker hop back
    to the same queue; it decides from the job as the claim read it.
    """
    started: list[str] = []
    if job_ids:
        started += _dispatch_batch(rt, job_ids)
    if rt.wakes is not None:
        # Disarmed first: from here on, a new enqueue arms (and sends) the next wake-up. A batch
        # shorter than asked for drained the list; an id pushed after that armed a new scan.
        started += drain_wakes(rt, rt.wakes.disarm_and_take(CLAIM_BATCH))
    return {"started": started}


def drain_wakes(rt: Dispatcher, batch: list[str], queues: Sequence[str] = ()) -> list[str]:
    """Claim a batch taken from the wake list, then the rest of the list, batch by batch. Once the
    process is shutting down, a batch taken and not yet claimed goes back for the next driver.
    ``queues``: a worker listener's, whose lists it took the batch from."""
    assert rt.wakes is not None
    started: list[str] = []
    while batch:
        if PROCESS.requested:
            hand_back_wakes(rt, batch, queues)
            break
        # No message named these jobs: record that this process holds them, so a delivery it
        # claims and then dies with is known lost (delivery/fetches.py).
        fetches.record_scan(batch)
        try:
            started += _dispatch_batch(rt, batch)
        except Exception:
            fetches.record_scan(batch, failed=True)
            raise
        batch = rt.wakes.take(CLAIM_BATCH, queues) if len(batch) == CLAIM_BATCH else []
    return started


def hand_back_wakes(rt: Dispatcher, batch: list[str], queues: Sequence[str] = ()) -> None:
    """Put wake-ups this process took but will not scan back on the driver's wake list (sending the
    wake-up message if no listener is left), so the next driver scans them at once instead of the
    queued redrive finding them after its minimum age. ``queues``: a worker listener's, whose
    lists' ids go with them."""
    assert rt.wakes is not None
    with contextlib.suppress(Exception):
        # This process listens no more: a push must send a message, or go to the driver's list.
        batch = [*batch, *rt.wakes.stop_listening(queues)]
    if not batch:
        return
    try:
        rt.delivery.wake_ids(batch)
        log.info("shutting down: %d wake-ups handed back to the next driver", len(batch))
    except Exception:  # best-effort, like every wake-up: the queued redrive still delivers them
        log.exception("shutting down: could not hand back %d wake-ups", len(batch))


def _dispatch_batch(rt: Dispatcher, woken: list[str]) -> list[str]:
    """A dispatch pass (``app/dispatch/line.py``) for each worker queue the woken ids name: a
    job's own queue, or a queue a freed place names (``@<queue>``). The jobs a pass chooses may be
    others than those woken: the line decides, in PostgreSQL. Woken jobs that their queue's last
    pass left room for are claimed first, without a pass (``app/dispatch/fast.py``); jobs that
    joined a line whose last pass found no free place wait for the next freed place's pass, and
    this process looks at that line within ``FULL_LINE_LOOK_S`` whatever happens."""
    started = _claim_directly(rt, [w for w in woken if not w.startswith(QUEUE_TOKEN)])
    if started:
        direct = set(started)
        woken = [w for w in woken if w not in direct]
        if not woken:
            return started
    tokens = {w[len(QUEUE_TOKEN) :] for w in woken if w.startswith(QUEUE_TOKEN)}
    ids = sorted({w for w in woken if not w.startswith(QUEUE_TOKEN)})
    joined = retry_transient(lambda: queues_of(rt, ids)) if ids else set()
    marks = _marks(rt, tokens | joined)
    freed = _waiting_in(tokens, marks)
    full = set() if marks is None else {q for q in joined - freed if marks.get(q) == LINE_FULL}
    look_at = time.monotonic() + FULL_LINE_LOOK_S
    for queue in full:
        rt.looks.setdefault(queue, look_at)
    for queue in sorted(freed | (joined - full)):
        started += dispatch_queue(rt, queue)
    return started


def _marks(rt: Dispatcher, queues: set[str]) -> dict[str, bytes] | None:
    """The marks of the lines among ``queues`` that hold jobs waiting (``delivery/wakes.py``); None
    without a wake list (the embedded broker) or while its Redis fails: then every line is taken to
    wait, and none to be full, rather than guessed."""
    if rt.wakes is None or not queues:
        return None
    try:
        return rt.wakes.line_marks(sorted(queues))
    except Exception:
        return None


def _waiting_in(queues: set[str], marks: dict[str, bytes] | None) -> set[str]:
    """Of ``queues``, those whose line holds jobs waiting by ``marks`` (all of them without marks):
    a pass elsewhere would find nothing to send."""
    return set(queues) if marks is None else {q for q in queues if q in marks}


def freed_waiting(rt: Dispatcher, tokens: set[str]) -> set[str]:
    """Of the queues where a place freed, those whose line holds jobs waiting."""
    return _waiting_in(tokens, _marks(rt, tokens))


def queues_of(rt: Dispatcher, ids: Sequence[str]) -> set[str]:
    """The worker queues of the woken jobs (from their rows' agent and kind). A queued row an older
    release wrote without its ``worker_queue`` gets it here, so the pass can find it in its line."""
    queues: set[str] = set()
    # One read alone: autocommitted, so it costs no BEGIN and ROLLBACK round trips of its own.
    with autocommit_connection(rt.engine) as conn:
        rows = projection.load_routes(conn, ids)
    unset: dict[str, list[str]] = {}
    for job_id, agent_id, kind, status, worker_queue in rows:
        queue = worker_queue or queue_for(agent_id, kind)
        queues.add(queue)
        if worker_queue is None and status == "queued":
            unset.setdefault(queue, []).append(job_id)
    if unset:
        with transaction(rt.engine) as conn:
            for queue, missing in unset.items():
                conn.execute(
                    update(jobs)
                    .where(jobs.c.id.in_(missing), jobs.c.worker_queue.is_(None))
                    .values(worker_queue=queue)
                )
    return queues


def dispatch_queue(rt: Dispatcher, queue: str, *, redrive: bool = False) -> list[str]:
    """One pass over ``queue``'s line, then the chosen attempts' worker messages; returns the ids
    of the jobs whose delivery it started. A pass asked for while this process runs one over the
    same queue folds into one more pass after it (``app.dispatch.gate``) and returns nothing here.
    ``redrive``: the queued redrive's pass, whose deliveries carry the spec's redrive key
    ``<jobId>:redrive:<seq>:<status>`` (one per observed queue state); it is never folded, so
    its deliveries keep that key."""
    if redrive:
        return _dispatch_once(rt, queue, redrive=True)
    return rt.gate.run(queue, lambda: _dispatch_once(rt, queue, redrive=False))


def _dispatch_once(rt: Dispatcher, queue: str, *, redrive: bool) -> list[str]:
    began_ns = time.time_ns() if tracing.on() else 0
    # Read before the messages are sent: a flush after this read is then always detected later.
    epoch = rt.broker.epoch()

    def one_pass() -> line.PassResult:
        with transaction(rt.engine) as conn:
            return line.run_pass(
                conn,
                queue,
                rt.settings,
                epoch=epoch,
                dispatch_key=_redrive_key if redrive else None,
            )

    result = retry_transient(one_pass)
    rt.passes[queue] = (time.monotonic(), result)
    rt.looks.pop(queue, None)
    rt.rooms.reset(queue)
    if rt.wakes is not None:
        try:
            rt.wakes.mark_line(queue, result.line_waiting, full=result.blocked)
        except Exception:  # best-effort: an unmarked line is still moved by the listener's look
            log.warning("could not mark the %s line", queue, exc_info=True)
    return _send_claimed(rt, result.claimed, began_ns)


def _claim_directly(rt: Dispatcher, ids: list[str]) -> list[str]:
    """Claim and send the woken jobs whose queue has room and no line (``app.dispatch.fast``);
    return their ids. The rest are left to the pass."""
    if not ids or not rt.rooms.any_room(rt.passes, time.monotonic()):
        return []
    began_ns = time.time_ns() if tracing.on() else 0
    epoch = rt.broker.epoch()

    def claim() -> list[tuple[Job, delivery.StartDecision | DeliveryGenerationsExceeded]]:
        with transaction(rt.engine) as conn:
            # The woken rows and the clock in one round trip.
            woken, now = projection.load_jobs_at_clock(conn, ids)
            org_policy = policies.org_policies(conn, rt.settings)
            by_queue: dict[str, list[Job]] = {}
            for job in woken:
                if fast.qualifies(job, now, org_policy):
                    by_queue.setdefault(queue_for(job.agent_id, job.kind), []).append(job)
            chosen: list[Job] = []
            for queue, candidates in by_queue.items():
                places = rt.rooms.take(queue, rt.passes.get(queue), time.monotonic(), len(candidates))
                chosen += fast.pick(candidates, places)
            return line.claim(conn, rt.settings, chosen, now, epoch)

    claimed = retry_transient(claim)
    if not claimed:
        return []
    return _send_claimed(rt, claimed, began_ns)


def _redrive_key(job: Job) -> str:
    return delivery.redrive_key(job.id, job.seq, job.status)


def _send_claimed(
    rt: Dispatcher,
    claimed: list[tuple[Job, delivery.StartDecision | DeliveryGenerationsExceeded]],
    began_ns: int,
) -> list[str]:
    started: list[str] = []
    to_send = [
        (job, decision)
        for job, decision in claimed
        if isinstance(decision, delivery.StartDecision) and decision.created
    ]
    for job, decision in claimed:
        if isinstance(decision, DeliveryGenerationsExceeded):
            with logs.bind_job(jobId=job.id):
                _generations_exhausted(rt, job.id, decision)
    buffered: list[_Buffered] = []
    # Attempts this process keeps for its own free slots (``execute.LocalRuns``), by queue: run once
    # the pass's messages have left.
    kept: list[tuple[str, list[Item]]] = []
    # The claimed jobs' scan records, their messages' sent records and the kept attempts' fetch
    # records, in one write: the claim has committed, and nothing leaves before it.
    with fetches.sent_in_advance(
        [(job.id, d.dispatch_key, d.generation) for job, d in to_send if not job.abort_requested],
        scanned=[job.id for job, _ in claimed],
    ) as advance:
        try:
            # The pass's worker messages leave in one pipeline, when the loop is done.
            with rt.delivery.batch() as producer:
                if rt.settings.delivery_batch_max > 1:
                    started += _deliver_grouped(rt, to_send, producer, buffered, kept)
                else:
                    for job, decision in to_send:
                        with logs.bind_job(jobId=job.id):
                            _count_delivery(decision, "dispatch")
                            started.append(job.id)
                            deliver(
                                rt,
                                job,
                                decision.dispatch_key,
                                decision.generation,
                                batch=(producer, buffered),
                            )
                for _queue, items in kept:
                    advance.hold(items)
                advance.write()  # before the pipeline goes: each record precedes its fetch
        except Exception:
            # The pipeline did not go (kombu discards what a failed batch buffered): end each of
            # these deliveries, as a failed send does, so the next pass may start another. A message
            # that did leave is then a duplicate, which its attempt fence makes inert.
            log.exception("could not send the worker tasks of %d jobs", len(buffered))
            if rt.local is not None:
                rt.local.release(sum(len(items) for _queue, items in kept))
            for b in buffered:
                settle_delivery(rt, b.job_id, b.dispatch_key, b.generation, "send_failed")
                rt.callbacks.forget(rt.engine, b.callback_event)
            raise
    if rt.local is not None:
        for queue_name, items in kept:
            rt.local.run(queue_name, items)
    if began_ns:
        for job, _decision in to_send:
            trace_dispatch(job, began_ns, "canceled" if job.abort_requested else "dispatched")
    return started


def trace_dispatch(job: Job, began_ns: int, outcome: str) -> None:
    """The job's dispatch in its trace: how long it waited queued (``receipt.queue_wait``, from
    the receipt that queued it, or its backoff's end, to the claim), and the claim and send
    (``receipt.dispatch``, from ``began_ns``)."""
    queued = max(parse_iso(job.updated_at) or EPOCH, not_before(job))
    attributes = {
        tracing.JOB_ID: job.id,
        tracing.ORGANIZATION: job.organization_id or "",
        tracing.AGENT: job.agent_id,
        tracing.KIND: job.kind,
        tracing.ATTEMPT: job.attempt + 1,
    }
    queued_ns = int(queued.timestamp() * 1e9)
    if queued > EPOCH and queued_ns < began_ns:
        with tracing.job_span(
            "receipt.queue_wait", job.id, job.trace_context, attributes, start_ns=queued_ns
        ):
            pass
    with tracing.job_span(
        "receipt.dispatch", job.id, job.trace_context, attributes, start_ns=began_ns, kind=SpanKind.PRODUCER
    ) as span:
        span.set_attribute(tracing.OUTCOME, outcome)


# One attempt as a worker message carries it: [job id, attempt fence, dispatch key, generation].
Item = list[Any]


def _deliver_grouped(
    rt: Dispatcher,
    to_send: list[tuple[Job, delivery.StartDecision]],
    producer: Any,
    buffered: list[_Buffered],
    kept: list[tuple[str, list[Item]]],
) -> list[str]:
    """The scan's deliveries with ``RECEIPT_DELIVERY_BATCH_MAX`` above 1: each decided as ``deliver``
    decides (an abort cancels; else a fence, and ``dispatched`` recorded before anything leaves),
    then the attempts bound for one worker queue leave as messages of up to that many items
    (``send_items``), but for those this process keeps for its own free slots (``kept``). Each item
    is buffered as soon as it is decided, so a failure anywhere before the pipeline goes ends every
    delivery decided so far."""
    started: list[str] = []
    by_queue: dict[str, list[Item]] = {}
    for job, decision in to_send:
        with logs.bind_job(jobId=job.id):
            _count_delivery(decision, "dispatch")
            started.append(job.id)
            if job.abort_requested:
                _cancel_aborted(rt, job, decision.dispatch_key, decision.generation)
                continue
            fence, queue_name, evt = _dispatched(rt, job)
            buffered.append(_Buffered(job.id, decision.dispatch_key, decision.generation, evt))
            by_queue.setdefault(queue_name, []).append(
                [job.id, fence, decision.dispatch_key, decision.generation]
            )
    size = rt.settings.delivery_batch_max
    for queue_name, items in by_queue.items():
        here = rt.local.reserve(queue_name, len(items)) if rt.local is not None else 0
        if here:
            kept.append((queue_name, items[:here]))
            items = items[here:]
        for at in range(0, len(items), size):
            send_items(rt, queue_name, items[at : at + size], producer=producer)
    return started


def send_items(rt: Dispatcher, queue: str, items: list[Item], *, producer: Any = None) -> None:
    """Send attempts bound for ``queue`` as one message: ``receipt.execute`` for one (its task id
    the fence), ``receipt.execute_batch`` for several (its task id the first fence and the count)."""
    if len(items) == 1:
        rt.delivery.send(EXECUTE_TASK, items[0], task_id=items[0][1], queue=queue, producer=producer)
        return
    rt.delivery.send(
        EXECUTE_BATCH_TASK, [items], task_id=batch_task_id(items), queue=queue, producer=producer
    )


def batch_task_id(items: list[Item]) -> str:
    """A batch message's Celery task id, derived from its first attempt's fence as single ones are."""
    return f"{items[0][1]}:batch:{len(items)}"


@dataclass(frozen=True)
class _Buffered:
    """A worker message in a scan's publish batch: what to undo if the batch does not go."""

    job_id: str
    dispatch_key: str
    generation: int
    callback_event: str | None


def _generations_exhausted(rt: Dispatcher, job_id: str, exc: DeliveryGenerationsExceeded) -> None:
    log.error("%s", exc)
    metrics.registry_metrics().generations_exhausted.inc()
    rt.queue.fail(job_id, None, None, str(exc), retryable=False, status="failed")


def start_driver(
    rt: Dispatcher,
    job_id: str,
    dispatch_key: str,
    *,
    presume_lost_after_ms: int | None = None,
) -> delivery.StartDecision | None:
    """The driver starter for one job (the recovery loops): record a delivery (or learn one is
    active), then begin the driver by sending the driver task."""
    job = rt.queue.get(job_id)
    if job is None or job.status != "queued":
        return None
    timing = timing_for(job.agent_id, job.kind, job.payload, rt.settings)
    # Read before the message is sent: a flush after this read is then always detected later.
    epoch = rt.broker.epoch()
    try:
        with transaction(rt.engine) as conn:
            now = db_now(conn)
            if not_before(job) > now:
                return None  # still backing off: the due-retries pass starts it when its time comes
            decision = delivery.begin(
                conn,
                job_id,
                dispatch_key,
                now,
                timing.driver_timeout_ms,
                epoch=epoch,
                presume_lost_before=(
                    now - timedelta(milliseconds=presume_lost_after_ms)
                    if presume_lost_after_ms is not None
                    else None
                ),
            )
    except DeliveryGenerationsExceeded as exc:
        _generations_exhausted(rt, job_id, exc)
        return None
    if not decision.created:
        return decision
    _count_delivery(decision, "redrive" if ":redrive:" in dispatch_key else "dispatch")
    try:
        rt.delivery.send(
            DRIVER_TASK,
            [job_id, dispatch_key, decision.generation],
            task_id=decision.task_id,
            queue=DRIVER_QUEUE,
        )
    except Exception:
        # The delivery never left: make it terminal so the next pass may start a new generation.
        log.exception("could not send the driver task for %s", job_id)
        settle_delivery(rt, job_id, dispatch_key, decision.generation, "send_failed")
        raise
    return decision


def _count_delivery(decision: delivery.StartDecision, path: str) -> None:
    metrics.registry_metrics().deliveries.labels(path, str(decision.generation > 0).lower()).inc()


def drive(rt: Dispatcher, job_id: str, dispatch_key: str, generation: int) -> DriveResult:
    """The driver: decide what this delivery does, from the job's current receipts."""
    if not tracing.on():
        return _drive(rt, job_id, dispatch_key, generation)
    began_ns = time.time_ns()
    job = retry_transient(lambda: rt.queue.get(job_id))
    result = _drive(rt, job_id, dispatch_key, generation, job)
    if job is not None:
        trace_dispatch(job, began_ns, result["outcome"])
    return result


def _drive(
    rt: Dispatcher, job_id: str, dispatch_key: str, generation: int, read: Job | None = None
) -> DriveResult:
    job = read if read is not None else retry_transient(lambda: rt.queue.get(job_id))
    if job is None or job.terminal:
        settle_delivery(rt, job_id, dispatch_key, generation, "terminal_state")
        return {"outcome": "terminal_state"}
    if job.status in LEASED_STATUSES:
        assert job.lease is not None
        deadline = parse_iso(job.lease.expires_at)
        if deadline is not None and deadline < db_now_of(rt):
            # A stale active lease ends the pass: fail that attempt (retryable) so the ordinary
            # redrive path picks the job up again. The delivery is settled *first*: the requeue's
            # wake-up fires inside the failure, and finding this delivery still pending it would
            # answer active_delivery and leave the retry to the queued redrive (min age 30 s).
            settle_delivery(rt, job_id, dispatch_key, generation, "stale_active_lease")
            retry_transient(
                lambda: rt.queue.fail(
                    job_id,
                    job.lease.worker_id if job.lease else None,
                    job.lease.attempt if job.lease else None,
                    STALE_ACTIVE_LEASE_ERROR,
                    retryable=True,
                    status="lease_lost",
                )
            )
            return {"outcome": "stale_active_lease"}
        settle_delivery(rt, job_id, dispatch_key, generation, "active_lease")
        return {"outcome": "active_lease"}
    # Only a job that is backing off pays for a clock read; every other drive skips it.
    if not job.abort_requested and job.available_at is not None and not_before(job) > db_now_of(rt):
        # A retry still backing off (a redrive raced the due-retries pass): not yet.
        settle_delivery(rt, job_id, dispatch_key, generation, "backoff")
        return {"outcome": "backoff"}
    return deliver(rt, job, dispatch_key, generation)


def deliver(
    rt: Dispatcher,
    job: Job,
    dispatch_key: str,
    generation: int,
    *,
    batch: tuple[Any, list[_Buffered]] | None = None,
) -> DriveResult:
    """The driver's last step for a queued job: honour ``abortRequested``, else send the worker
    message under a fresh attempt fence. With ``batch`` (a producer from ``rt.delivery.batch()``, and
    the list the scan keeps), the message is buffered and recorded there; it leaves with the batch."""
    job_id = job.id
    if job.abort_requested:
        return _cancel_aborted(rt, job, dispatch_key, generation)
    fence, queue_name, evt = _dispatched(rt, job)
    try:
        rt.delivery.send(
            EXECUTE_TASK,
            [job_id, fence, dispatch_key, generation],
            task_id=fence,
            queue=queue_name,
            producer=batch[0] if batch else None,
        )
        if batch:
            batch[1].append(_Buffered(job_id, dispatch_key, generation, evt))
    except Exception:
        # The worker message never left: end this delivery so the next pass may start another.
        log.exception("could not send the worker task for %s", job_id)
        settle_delivery(rt, job_id, dispatch_key, generation, "send_failed")
        rt.callbacks.forget(rt.engine, evt)
        raise
    return {"outcome": "dispatched", "fence": fence, "queue": queue_name}


def _dispatched(rt: Dispatcher, job: Job) -> tuple[str, str, str | None]:
    """A worker message about to be sent: its attempt fence, its routed queue, and the
    ``dispatched`` callback event, recorded before the message leaves so that it is ordered before
    the job's terminal event (which the worker's settlement records) for every receiver."""
    fence = delivery.attempt_fence(job.id, job.attempt + 1)
    logs.update_job(org=job.organization_id, attempt=job.attempt + 1, fence=fence)
    return fence, route(job.agent_id, job.kind).queue, rt.callbacks.dispatched(rt.engine, job, fence)


def _cancel_aborted(rt: Dispatcher, job: Job, dispatch_key: str, generation: int) -> DriveResult:
    """A queued job whose abort is pending is canceled instead of delivered."""
    retry_transient(lambda: rt.queue.cancel_queued(job.id, job.abort_reason))
    settle_delivery(rt, job.id, dispatch_key, generation, "canceled")
    return {"outcome": "canceled"}


def deliver_stale(rt: Dispatcher, job: Job, min_age_ms: int) -> bool:
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


def db_now_of(rt: Dispatcher) -> datetime:
    with rt.engine.connect() as conn:
        return db_now(conn)


def settle_delivery(
    rt: Dispatcher, job_id: str, dispatch_key: str, generation: int, outcome: DeliveryOutcome | AttemptStatus
) -> None:
    try:
        with transaction(rt.engine) as conn:
            delivery.settle(conn, job_id, dispatch_key, generation, outcome, db_now(conn))
    except Exception:  # best-effort bookkeeping: an unsettled delivery only expires later
        log.exception("could not settle delivery %s/%s", dispatch_key, generation)
