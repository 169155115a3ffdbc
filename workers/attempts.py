"""The worker messages: run one attempt (``receipt.execute``) or several (``receipt.execute_batch``),
and settle each delivery record.

Both draw from the process's slots (``workers/slots.py``), so the process never runs more attempts
at once than its role's concurrency. A batch leases as many of its attempts as it has slots for, in
one statement and one commit (``workers.runner.lease_attempts``), runs them on reused threads,
and leases the rest, again together, as slots free. Fetched attempts that no slot frees for within
``RECEIPT_DELIVERY_HOLD_MS`` (every slot busy with long jobs) are handed back to their queue in one
message, so that a process with a free slot takes them rather than their waiting behind this one's
running attempts; so is every attempt not yet leased when the process begins shutting down, as a
warm shutdown puts back a message it fetched and did not start. Callbacks need nothing here: a
terminal settlement writes its outbox rows in its own transaction.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from app.jobs.routing import EXECUTE_BATCH_TASK, route
from app.ops import logs, metrics
from app.ops.shutdown import PROCESS, Shutdown
from app.storage.concurrency_keys import KEY_FULL
from app.storage.delivery import parse_fence
from delivery import fetches
from delivery.dispatch import Item, send_items, settle_delivery
from workers.handler_pool import HandlerPool, HandlerRun
from workers.runner import AttemptResult, Started, lease_attempts, new_worker_id, run_attempt, run_started
from workers.runtime import Runtime
from workers.slots import Slots

log = logging.getLogger("receipt.execute")

# Outcomes in which this delivery did not own the job (a duplicate or superseded message):
# its delivery record is left to the attempt that does own it, and no callback is posted.
NOT_OWNED = frozenset({"lease_lost", "stale_attempt", "terminal_state"})
# A delivery waiting for a slot looks this often whether its process began shutting down.
SLOT_POLL_S = 0.5
# What the task returns for an attempt it did not run: handed back at shutdown, or not leased
# because its lease statement failed (its delivery is then recorded failed, and redelivered).
HANDED_BACK, NOT_LEASED = "handed_back", "not_leased"
COMPLETED = "completed"
# How each hand-back reason reads in the log.
_HAND_BACK_LOG = {"busy": "no free slot", "shutdown": "shutting down"}
# The threads a batch's attempts run on, reused from one batch to the next as handlers' are.
_ATTEMPTS = HandlerPool()


def execute(
    rt: Runtime,
    job_id: str,
    fence: str,
    dispatch_key: str,
    generation: int,
    *,
    queue: str | None = None,
    shutdown: Shutdown = PROCESS,
) -> dict[str, Any]:
    fenced_job, attempt = parse_fence(fence)
    if fenced_job != job_id:
        return {"status": "stale_attempt", "error": f"fence {fence} is not for job {job_id}"}
    if not take_or_hand_back(rt, queue, [[job_id, fence, dispatch_key, generation]], shutdown):
        return {"status": HANDED_BACK, "jobStatus": None, "error": None}
    try:
        result = run_attempt(rt.queue, rt.settings, rt.registry, job_id, attempt, shutdown=shutdown)
    finally:
        rt.slots.give(1)
    return finish(rt, job_id, fence, dispatch_key, generation, result)


def finish(
    rt: Runtime, job_id: str, fence: str, dispatch_key: str, generation: int, result: AttemptResult
) -> dict[str, Any]:
    """After an attempt ended: its delivery record, and the wake-up of a job it requeued."""
    job = result.job
    # Every outcome is counted; a line is written at INFO only for one an operator looks into (a lost
    # lease, a conflict, a failure...): a completed attempt's line, one per job, is DEBUG. Celery's
    # own "succeeded" line does not show the return value (tasks/redaction.py): the outcome, a
    # vocabulary word, is logged here instead, never the job's payload or result.
    metrics.observe_attempt(result.status)
    log.log(
        logging.DEBUG if result.status == COMPLETED else logging.INFO, "delivery %s: %s", fence, result.status
    )
    if result.status == KEY_FULL:
        # Its key was full at the lease: nothing was written, the job waits in its line again, and
        # the attempt holding the key wakes the line when it ends.
        settle_delivery(rt, job_id, dispatch_key, generation, result.status)
        return {"status": result.status, "jobStatus": job.status if job else None, "error": None}
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


def take_slots(slots: Slots, want: int, shutdown: Shutdown, within_s: float | None = None) -> int:
    """Wait for at least one slot (up to ``want``); 0 once the process is shutting down instead,
    or when none freed within ``within_s`` seconds (None: no limit)."""
    deadline = None if within_s is None else time.monotonic() + within_s
    while True:
        wait = SLOT_POLL_S if deadline is None else min(SLOT_POLL_S, max(0.0, deadline - time.monotonic()))
        got = slots.take(want, wait)
        if got or shutdown.requested or (deadline is not None and time.monotonic() >= deadline):
            return got


def take_or_hand_back(rt: Runtime, queue: str | None, items: list[Item], shutdown: Shutdown) -> int:
    """Slots for up to ``len(items)`` of these fetched attempts, waiting for the first; or 0 once
    they were handed back to their queue instead: no slot freed within ``RECEIPT_DELIVERY_HOLD_MS``
    (another process may have one), or the process is shutting down. A busy hand-back whose
    publish fails keeps them here, waiting for this process's slots. So does a process whose
    consumer is not gated on its slots (the embedded folder broker: ``tasks/consumer.py``), which
    would fetch the handed-back message again at once."""
    hold_s = rt.settings.delivery_hold_ms / 1000 if rt.fetch_gated else None
    got = 0 if shutdown.requested else take_slots(rt.slots, len(items), shutdown, hold_s)
    if got:
        return got
    if not shutdown.requested:
        if hand_back(rt, queue, items, reason="busy"):
            return 0
        # The broker refused it: the attempts are still this process's and wait for its slots.
        got = take_slots(rt.slots, len(items), shutdown)
        if got:
            return got
    hand_back(rt, queue, items)  # shutting down: back to the queue, never started here
    return 0


def hand_back(rt: Runtime, queue: str | None, items: list[Item], *, reason: str = "shutdown") -> bool:
    """Put attempts this process fetched and will not start back on their worker queue, in one
    message (the next worker fetches it; each fence still guards its attempt). Without the queue
    the message came from, each job's route says it. False when the publish failed: their fetch
    records still name this process, whose death then makes each delivery lost for the redrive.
    ``reason``: one of ``metrics.HAND_BACK_REASONS``, counted and logged."""
    why = _HAND_BACK_LOG[reason]
    by_queue: dict[str, list[Item]] = {}
    try:
        for item in items:
            name = queue
            if name is None:
                job = rt.queue.get(item[0])
                if job is None:
                    continue
                name = route(job.agent_id, job.kind).queue
            by_queue.setdefault(name, []).append(item)
        for name, group in by_queue.items():
            send_items(rt, name, group)
    except Exception:
        log.exception("%s: could not hand back %d fetched attempts", why, len(items))
        return False
    log.info("%s: %d fetched attempts handed back to their queue", why, len(items))
    metrics.observe_hand_back(reason, len(items))
    return True


def execute_batch(
    rt: Runtime,
    items: list[Item],
    *,
    queue: str | None = None,
    shutdown: Shutdown = PROCESS,
    held: int = 0,
) -> dict[str, Any]:
    """Run the attempts of one ``receipt.execute_batch`` message within this process's slots.
    ``held``: slots already taken for the first attempts (a local run's, ``LocalRuns``)."""
    results: dict[str, dict[str, Any]] = {}
    pending: list[tuple[Item, int]] = []
    for item in items:
        job_id, fence = item[0], item[1]
        fenced_job, attempt = parse_fence(fence)
        if fenced_job != job_id:
            results[fence] = {"status": "stale_attempt", "error": f"fence {fence} is not for job {job_id}"}
        else:
            pending.append((item, attempt))
    slots = rt.slots
    if held > len(pending):  # slots held for items that will not run here (a fence for another job)
        slots.give(held - len(pending))
        held = len(pending)
    running: list[HandlerRun] = []
    lock = threading.Lock()

    def record(fence: str, outcome: dict[str, Any]) -> None:
        with lock:
            results[fence] = outcome

    def run(item: Item, started: Started) -> None:
        job_id, fence, key, generation = item
        try:
            with logs.bind_job(jobId=job_id, fence=fence, workerId=started.attempt.worker_id):
                result = run_started(started, rt.registry, shutdown)
                record(fence, finish(rt, job_id, fence, key, generation, result))
        except Exception as exc:
            # As a single delivery's task raising: its delivery is recorded failed (redelivered).
            log.exception("attempt %s raised", fence)
            fetches.record_failed(EXECUTE_BATCH_TASK, [[item]])
            record(fence, {"status": NOT_LEASED, "error": f"{type(exc).__name__}: {exc}"})
        finally:
            slots.give(1)

    while pending:
        if held:
            got, held = held, 0
        else:
            got = take_or_hand_back(rt, queue, [item for item, _ in pending], shutdown)
        if not got:
            for item, _ in pending:
                results[item[1]] = {"status": HANDED_BACK}
            break
        group, pending = pending[:got], pending[got:]
        try:
            outcomes = lease_attempts(
                rt.queue,
                rt.settings,
                [(item[0], attempt) for item, attempt in group],
                [new_worker_id(rt.settings) for _ in group],
            )
        except Exception as exc:
            # The statement rolled back: none of these holds a lease. Each delivery is recorded
            # failed, so the redrive redelivers it; the attempts not yet tried go on.
            slots.give(got)
            log.exception("could not lease %d attempts of a batch", len(group))
            fetches.record_failed(EXECUTE_BATCH_TASK, [[item for item, _ in group]])
            for item, _ in group:
                results[item[1]] = {"status": NOT_LEASED, "error": f"{type(exc).__name__}: {exc}"}
            continue
        for (item, _), outcome in zip(group, outcomes, strict=True):
            if isinstance(outcome, Started):
                running.append(_ATTEMPTS.submit(functools.partial(run, item, outcome)))
                continue
            slots.give(1)
            if isinstance(outcome, Exception):
                log.error("could not lease %s: %s", item[1], outcome)
                fetches.record_failed(EXECUTE_BATCH_TASK, [[item]])
                results[item[1]] = {"status": NOT_LEASED, "error": f"{type(outcome).__name__}: {outcome}"}
            else:
                with logs.bind_job(jobId=item[0], fence=item[1]):
                    results[item[1]] = finish(rt, item[0], item[1], item[2], item[3], outcome)
    for started_run in running:
        started_run.join()
    return {"items": [{"fence": item[1], **results[item[1]]} for item in items]}


# Slots a local run never takes: a message already waiting for this process (another organisation's
# job a pass claimed earlier) gets a slot at the consumer's next fetch instead of waiting behind
# the attempts this process's own passes keep.
LEAVE_FOR_MESSAGES = 1


class LocalRuns:
    """The attempts a worker process's own dispatch pass claimed for its free slots, run here
    without a broker message (``RECEIPT_DELIVERY_LOCAL``).

    The refill (``delivery.listeners.Refill``) runs the pass of a line whose places this process's ended
    attempts freed. Sending what it claims as a message to the same queue costs a publish, and then a
    fetch, a decode and a hand-off to Celery's pool in whichever process takes it: about a third of a
    busy worker's CPU (bench/README.md, "Half the CPU per job"). The pass instead ``reserve``s as many of this
    process's free slots as it claimed attempts for a queue this process consumes, without waiting,
    and ``run``s those attempts here once the pass's own messages have left; the rest leave as
    messages, for the other processes' places. Each one is recorded as fetched by this consumer
    first, exactly as a fetched message's attempts are (``delivery/fetches.py``), so a process that dies
    holding them leaves them lost for the redrive within seconds. Nothing is reserved once the
    process is shutting down; ``stop`` waits for the runs, which finish or hand their attempts back
    within the shutdown's grace.
    """

    def __init__(self, rt: Runtime, queues: Sequence[str]) -> None:
        self.rt = rt
        self.queues = frozenset(queues)
        self._pool = HandlerPool()
        self._lock = threading.Lock()
        self._running: list[HandlerRun] = []
        self._stopped = False
        self.runs = 0  # batches run here (tests, benches)

    def reserve(self, queue: str, want: int) -> int:
        """Take up to ``want`` of this process's free slots for attempts bound for ``queue``, now,
        leaving one free (``LEAVE_FOR_MESSAGES``) for a message already waiting for this process.
        Nothing for a queue its consumer has stopped reading (an operator's ``cancel_consumer``):
        this process takes no work of that queue by any path."""
        if self._stopped or PROCESS.requested or want < 1 or not self._consumes(queue):
            return 0
        return self.rt.slots.take_leaving(want, LEAVE_FOR_MESSAGES)

    def _consumes(self, queue: str) -> bool:
        if queue not in self.queues:
            return False
        consumed = getattr(getattr(self.rt.app.amqp, "queues", None), "consume_from", None)
        return consumed is None or queue in consumed

    def release(self, n: int) -> None:
        """Give back slots reserved for attempts that will not run here (their pass failed)."""
        self.rt.slots.give(n)

    def run(self, queue: str, items: list[Item]) -> None:
        """Run ``items`` (as many as were reserved) here. The caller has recorded them as this
        process's fetch, in its pass's one write (``fetches.sent_in_advance``)."""
        run = self._pool.submit(functools.partial(self._run, queue, items))
        with self._lock:
            self._running = [r for r in self._running if r.is_alive()]
            self._running.append(run)
            self.runs += 1

    def _run(self, queue: str, items: list[Item]) -> None:
        try:
            execute_batch(self.rt, items, queue=queue, held=len(items))
        except Exception:  # as a batch task raising: each delivery recorded failed, redelivered
            log.exception("a local run of %d attempts raised", len(items))
            fetches.record_failed(EXECUTE_BATCH_TASK, [items])

    def stop(self, timeout_s: float) -> None:
        """Reserve nothing more, and wait up to ``timeout_s`` for the runs in progress."""
        self._stopped = True
        deadline = time.monotonic() + timeout_s
        with self._lock:
            running = list(self._running)
        for run in running:
            run.join(max(0.0, deadline - time.monotonic()))
