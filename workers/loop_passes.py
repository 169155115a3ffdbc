"""The recovery loops' passes, bound to their declarations (``app/ops/loop_registry.py``), and the
local ticker.

Every pass is idempotent (every write is decided from receipts and fenced) and runs in the one
claim-and-renew wrapper, ``app.storage.loop_claims.run_claimed``, under the claim policy its loop
declares: two beats running by mistake do no harm, and a pass that dies frees its loop within
about one interval.

Beat schedules the passes. So that recovery does not hang on that one process, every worker process
also runs a ``LocalTicker`` over the loops whose queue it consumes: when a loop's last run is older
than ``TICKER_FACTOR`` (2) periods -- beat is down, or its ticks are lost -- the ticker runs a pass
itself, through the same claim, so it acts before ``/readyz`` would call the loop overdue
(3 periods). A loop that declares a first delay (the queued redrive) also gets its first pass that
long after the ticker starts, as beat gives it one after beat starts.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from app import tracing
from app.factory import recovery
from app.jobs.reducer import Job
from app.jobs.routing import DRIVER_QUEUE, QUEUES, route
from app.ops import logs, loop_registry, metrics
from app.ops.loop_registry import Loop
from app.retention import archive as retention
from app.retention.policy import Policy
from app.retention.sink import DirectorySink
from app.schedules import service as schedules
from app.storage import delivery, loop_claims
from app.storage import liveness as worker_liveness
from app.storage.db import db_now, transaction
from app.storage.queue import Queue
from delivery import fetches
from delivery.dispatch import deliver_stale, dispatch_queue, start_driver
from workers.roles import ROLES
from workers.runtime import Runtime

log = logging.getLogger("receipt.loops")

REDRIVE_LOOP = loop_registry.QUEUED_REDRIVE.name
RETRY_LOOP = loop_registry.DUE_RETRIES.name
EXPIRY_LOOP = loop_registry.LEASE_EXPIRY.name
CALLBACK_LOOP = loop_registry.CALLBACKS.name
SCAN_LIMIT = 500
STALE_FACTOR = loop_claims.STALE_FACTOR
# The ticker steps in at 2 periods, before /readyz calls a loop overdue at 3: with beat down, a
# loop's last run then never ages past 3 periods while a consumer of its queue lives.
TICKER_FACTOR = 2
overdue = loop_claims.overdue


# -- binding a pass to its loop ------------------------------------------------------------------------


@dataclass(frozen=True)
class Pass:
    """What one pass is given besides the runtime: ``keep`` (call it between items: it renews the
    claim, and raises ``LoopClaimLost`` once the pass lost its loop) and ``published`` (when beat
    published the tick, for a cron loop; None when the local ticker or a test runs the pass)."""

    keep: loop_claims.KeepAlive
    published: datetime | None = None
    # The pass's span when tracing is on (``link`` names its jobs).
    trace: tracing.LoopTrace | None = None

    def link(self, jobs: Iterable[Job]) -> None:
        """Link the pass's span to the traces of the jobs it acted on (a no-op without tracing)."""
        if self.trace is not None:
            self.trace.link([(job.id, job.trace_context) for job in jobs])

    def link_ids(self, queue: Queue, job_ids: Iterable[str]) -> None:
        """``link`` for jobs known by id: each is read (with tracing on only) for its stored context."""
        if self.trace is not None:
            self.link(job for job in (queue.get(job_id) for job_id in job_ids) if job is not None)


PassBody = Callable[[Runtime, Pass], dict[str, Any]]
PASSES: dict[str, PassBody] = {}


def binds(loop: Loop) -> Callable[[PassBody], Callable[[Runtime], dict[str, Any]]]:
    """Declare ``loop``'s pass. The decorated name runs one claimed pass: ``redrive_queued(rt)``."""

    def decorate(body: PassBody) -> Callable[[Runtime], dict[str, Any]]:
        if loop.name in PASSES:
            raise ValueError(f"recovery loop {loop.name!r} already has a pass")
        PASSES[loop.name] = body

        @functools.wraps(body)
        def claimed(rt: Runtime) -> dict[str, Any]:
            return run(rt, loop)

        return claimed

    return decorate


def unbound() -> list[str]:
    """Declared loops that have no pass (``make_celery`` refuses to build an app with one)."""
    return [loop.name for loop in loop_registry.LOOPS if loop.name not in PASSES]


def run(
    rt: Runtime,
    loop: Loop,
    published: datetime | None = None,
    *,
    clock: loop_claims.Clock = loop_claims.SYSTEM_CLOCK,
) -> dict[str, Any]:
    """One pass of ``loop`` in the claim-and-renew wrapper: its result, ``{"skipped": True}`` when
    another pass holds or just ran the loop (or the deployment runs no such loop), or
    ``{"lost": True}`` when the pass stalled past its claim and stopped."""
    if not loop.enabled(rt.settings):
        return {"skipped": True}
    body = PASSES[loop.name]
    policy = loop_registry.policy(loop, rt.settings, datetime.now(UTC))
    counted = metrics.registry_metrics().loop_passes

    def traced(keep: loop_claims.KeepAlive) -> dict[str, Any]:
        if not tracing.on():
            return body(rt, Pass(keep, published))
        with tracing.loop_trace(loop.name) as trace:
            return body(rt, Pass(keep, published, trace))

    try:
        outcome = loop_claims.run_claimed(rt.engine, loop.name, policy, traced, clock=clock)
    except Exception:
        counted.labels(loop.name, "failed").inc()
        raise
    counted.labels(loop.name, outcome.kind).inc()
    return outcome.result


# -- the passes ------------------------------------------------------------------------------------------

# A pending delivery is presumed lost (the broker holding no message it could be) only once it is
# this old: between recording a delivery and sending its message, a loaded driver can take seconds.
PRESUME_LOST_AFTER_MS = 5000


def presume_after_ms(cooldown_ms: int) -> int:
    return max(cooldown_ms, PRESUME_LOST_AFTER_MS)


@binds(loop_registry.QUEUED_REDRIVE)
def redrive_queued(rt: Runtime, p: Pass) -> dict[str, Any]:
    """Move every waiting line a lost wake-up may have left still, and end the delivery records that
    can no longer matter.

    Queued jobs wait in PostgreSQL's line (docs/dispatch.md), so no job is stuck on its own: a line
    is, when the wake-ups that would have moved it were lost. Each worker queue with a job ready for
    at least the minimum age gets a dispatch pass here, which sends whatever is next in line. A
    pending delivery of a queued job is ended first when it can no longer be in flight: its message
    died with its fetcher, went to an earlier broker epoch or, with every queue empty and no live
    consumer holding it, is presumed lost once older than the cooldown (at least five seconds).
    """
    s = rt.settings
    with transaction(rt.engine) as conn:
        swept = delivery.sweep(conn, db_now(conn))
    epoch = rt.broker.epoch()
    # Deliveries whose message died with the process that fetched it end first, so the passes
    # below may send those jobs again at once (delivery/fetches.py).
    lost, held = settle_lost_fetches(rt, epoch)
    presumed: list[str] = []
    if rt.broker.queues_empty([DRIVER_QUEUE, *QUEUES.values()]) is True:
        presumed = settle_presumed_lost(rt, epoch, held, presume_after_ms(s.queued_redrive_cooldown_ms))
    started: list[str] = []
    for queue in rt.queue.lines_waiting_since(s.queued_redrive_min_age_ms):
        p.keep()
        try:
            started += dispatch_queue(rt, queue, redrive=True)
        except Exception:
            log.exception("redrive of the %s line failed; next pass retries", queue)
    if started:
        log.info("redrive started %d deliveries", len(started))
        metrics.registry_metrics().redrives.inc(len(started))
        p.link_ids(rt.queue, started)
    return {"redriven": started, "swept": swept, "fetcherLost": lost, "presumedLost": presumed}


def settle_presumed_lost(rt: Runtime, epoch: str | None, held: Collection[str], after_ms: int) -> list[str]:
    """With every queue empty, end ``presumed_lost`` each pending delivery of a queued job older than
    ``after_ms`` that no live consumer holds: no message anywhere can be it."""
    with transaction(rt.engine) as conn:
        now = db_now(conn)
        cutoff = now - timedelta(milliseconds=after_ms)
        rows = [
            r
            for r in delivery.pending_of_queued(conn, now, epoch, SCAN_LIMIT)
            if r.job_id not in held and r.created_at < cutoff
        ]
        for row in rows:
            delivery.settle_pending(conn, row, "presumed_lost", now)
    return [r.job_id for r in rows]


def settle_lost_fetches(rt: Runtime, epoch: str | None) -> tuple[list[str], set[str]]:
    """Settle ``fetcher_lost`` every pending delivery of a queued job whose message was fetched by
    a process that is no longer alive, or that gave up on it (delivery/fetches.py). Returns those job
    ids, and the jobs whose delivery a live consumer holds right now (never presumed lost). Best
    effort: on a broker error nothing is known and the earlier rules (epoch, presumption, deadline)
    apply."""
    client = rt.broker.client()
    if client is None:
        return [], set()
    with rt.engine.connect() as conn:
        now = db_now(conn)
        rows = delivery.pending_of_queued(conn, now, epoch, SCAN_LIMIT)
    pending = [
        fetches.Pending(r.job_id, r.purpose, r.observed, r.generation, r.task_id, _age_ms(now, r.created_at))
        for r in rows
    ]
    try:
        found = fetches.verdicts(client, pending)
    except Exception as exc:
        log.warning("could not read the fetch records: %s", exc)
        return [], set()
    held = {r.job_id for r, v in zip(rows, found, strict=True) if v == fetches.HELD_ALIVE}
    lost = [r for r, v in zip(rows, found, strict=True) if v == fetches.LOST]
    if lost:
        with transaction(rt.engine) as conn:
            now = db_now(conn)
            for row in lost:
                delivery.settle_fetcher_lost(conn, row, now)
    ids = [r.job_id for r in lost]
    if ids:
        log.warning("%d deliveries lost with their fetcher: %s", len(ids), ", ".join(ids[:20]))
    return ids, held


@binds(loop_registry.LOST_DELIVERIES)
def redeliver_lost(rt: Runtime, p: Pass) -> dict[str, Any]:
    """End every pending delivery of a queued job whose message is lost -- died with its fetcher
    (``fetcher_lost``) or sent long enough ago, fetched by nobody, its queue empty (``unfetched``,
    delivery/fetches.py) -- and send each of those jobs again in this pass. The queued redrive would
    too, but only for jobs past its minimum age (30 s by default) and once per cooldown."""
    epoch = rt.broker.epoch()
    lost, _held = settle_lost_fetches(rt, epoch)
    gone = settle_unfetched(rt, epoch)
    sweep = getattr(rt.broker.client(), "sweep", None)
    if callable(sweep):
        sweep()
    started = []
    for job_id in dict.fromkeys([*lost, *gone]):
        p.keep()
        job = rt.queue.get(job_id)
        if job is None or job.status != "queued":
            continue
        try:
            with logs.bind_job(jobId=job.id, org=job.organization_id):
                decision = start_driver(rt, job.id, delivery.redrive_key(job.id, job.seq, job.status))
        except Exception:
            log.exception("sending %s again failed; next pass retries", job.id)
            continue
        if decision is not None and decision.created:
            started.append(job.id)
    if started:
        log.info("sent %d jobs again whose message was lost", len(started))
        metrics.registry_metrics().redrives.inc(len(started))
    return {"redelivered": started, "fetcherLost": lost, "unfetched": gone}


def settle_unfetched(rt: Runtime, epoch: str | None) -> list[str]:
    """Settle ``unfetched`` every pending delivery of a queued job whose message was sent at least
    ``RECEIPT_REDELIVER_UNFETCHED_MS`` ago, was fetched by nobody, and whose queue is empty
    (delivery/fetches.py, "Unfetched"); returns those job ids. Best effort, like the fetch records."""
    client = rt.broker.client()
    if client is None:
        return []
    with rt.engine.connect() as conn:
        now = db_now(conn)
        rows = delivery.pending_of_queued(conn, now, epoch, SCAN_LIMIT)
    if not rows:
        return []
    pending = [
        fetches.Pending(r.job_id, r.purpose, r.observed, r.generation, r.task_id, _age_ms(now, r.created_at))
        for r in rows
    ]
    queues = [route(r.agent_id, r.kind).queue for r in rows]
    try:
        found = fetches.unfetched(
            client,
            pending,
            queues,
            rt.broker.queue_lengths,
            bound_ms=rt.settings.redeliver_unfetched_ms,
            ttl_ms=fetches.record_ttl_ms(rt.settings),
        )
    except Exception as exc:
        log.warning("could not read the fetch records: %s", exc)
        return []
    gone = [r for r, lost in zip(rows, found, strict=True) if lost]
    if not gone:
        return []
    with transaction(rt.engine) as conn:
        now = db_now(conn)
        for row in gone:
            delivery.settle_unfetched(conn, row, now)
    ids = [r.job_id for r in gone]
    log.warning(
        "%d deliveries unfetched for %d ms with their queue empty (message lost): %s",
        len(ids),
        rt.settings.redeliver_unfetched_ms,
        ", ".join(ids[:20]),
    )
    return ids


def _age_ms(now: datetime, then: datetime) -> float:
    return (now - then).total_seconds() * 1000


@binds(loop_registry.LEASE_EXPIRY)
def expire_leases(rt: Runtime, p: Pass) -> dict[str, Any]:
    """Append ``job.lease_expired`` for every lease past its deadline (database clock)."""
    expired = rt.queue.expire_leases(limit=SCAN_LIMIT, between=p.keep)
    p.link(expired)
    if expired:
        log.info("expired %d leases", len(expired))
    return {"expired": [j.id for j in expired]}


@binds(loop_registry.DUE_RETRIES)
def dispatch_due_retries(rt: Runtime, p: Pass) -> dict[str, Any]:
    """A dispatch pass for each worker queue with a retry (or a delayed job) whose time has come
    (``availableAt`` ≤ database now) and no delivery in flight: the pass sends it when it is next."""
    due = rt.queue.due_retries(limit=SCAN_LIMIT, skip_in_flight=True, epoch=rt.broker.epoch())
    started: list[str] = []
    for queue in sorted({route(job.agent_id, job.kind).queue for job in due}):
        p.keep()
        try:
            started += dispatch_queue(rt, queue)
        except Exception:
            log.exception("dispatch of the %s line's due retries failed; next pass retries", queue)
    p.link([job for job in due if job.id in set(started)])
    return {"started": started}


@binds(loop_registry.CALLBACKS)
def send_callbacks(rt: Runtime, p: Pass) -> dict[str, Any]:
    """Deliver the callback outbox (delivery/callbacks.py): at least once, signed, in order per job."""
    from delivery.callbacks import Sender, send_due

    sender: Sender | None = getattr(rt, "_sender", None)
    if sender is None:
        sender = Sender(rt.settings)
        rt._sender = sender  # type: ignore[attr-defined]
    return send_due(rt.engine, sender, p.keep)


@binds(loop_registry.OUTBOX_REDRIVE)
def objective_outbox_redrive(rt: Runtime, p: Pass) -> dict[str, Any]:
    """The objective-control outbox redrive (``app/factory/recovery.py``), delivering a control job
    whose own wake-up was lost through the driver starter."""
    return recovery.outbox_redrive(
        rt.queue, rt.settings, lambda job, age_ms: deliver_stale(rt, job, age_ms), p.keep
    )


@binds(loop_registry.OBJECTIVE_WATCHDOG)
def objective_watchdog_tick(rt: Runtime, p: Pass) -> dict[str, Any]:
    """Enqueue the watchdog job of the tick beat published (or of the latest tick, database clock)."""
    result = recovery.watchdog_tick(rt.queue, rt.settings, p.published)
    if "jobId" in result:
        p.link_ids(rt.queue, [result["jobId"]])
    return result


@binds(loop_registry.SCHEDULES)
def fire_schedules(rt: Runtime, p: Pass) -> dict[str, Any]:
    """Fire every due schedule tick, page by page (``app/schedules/service.py``)."""
    totals = schedules.run_pass(
        rt.queue,
        page_size=max(1, rt.settings.schedule_page_size),
        keep=p.keep,
        lead_ms=rt.settings.schedule_lead_ms,
    )
    metrics.observe_schedules(totals.outcomes, totals.late_ms)
    result = totals.to_json()
    if totals.fired or totals.missed or totals.skipped or totals.failed:
        log.info(
            "schedules pass: %d fired (%d new), %d missed, %d skipped, %d buffered over %d schedules",
            totals.fired,
            totals.created,
            totals.missed,
            totals.skipped,
            totals.buffered,
            totals.schedules,
        )
    return result


@binds(loop_registry.WORKER_LIVENESS)
def expire_dead_workers(rt: Runtime, p: Pass) -> dict[str, Any]:
    """Expire at once the jobs of every worker process whose liveness lapsed (app/storage/liveness.py)."""
    declared = worker_liveness.expire_dead(
        rt.queue, rt.settings.worker_dead_after_ms, limit=SCAN_LIMIT, between=p.keep
    )
    p.link_ids(rt.queue, [j for d in declared for j in d.expired])
    for d in declared:
        log.warning(
            "worker %s declared dead (last renewed %s): expired %d leases",
            d.process_id,
            d.renewed_at.isoformat(),
            len(d.expired),
        )
    return {"dead": [d.process_id for d in declared], "expired": [j for d in declared for j in d.expired]}


@binds(loop_registry.ARCHIVE)
def archive(rt: Runtime, p: Pass) -> dict[str, Any]:
    """Archive every eligible stream, page by page (``app/retention/archive.py``)."""
    s = rt.settings
    totals = retention.run_pass(
        rt.engine,
        DirectorySink(s.archive_path),
        Policy.from_settings(s),
        page_size=max(1, s.archive_page_size),
        keep=p.keep,
        duty_percent=s.archive_duty_percent,
    )
    metrics.observe_archive(totals)
    if totals.streams or totals.orphans_removed or totals.skipped:
        log.info(
            "archive pass: %d streams (%d jobs, %d objectives, %d receipts) in %d segments, %d bytes; "
            "%d left in place, %d stray segments removed",
            totals.streams,
            totals.jobs,
            totals.objectives,
            totals.receipts,
            len(totals.segments),
            totals.bytes,
            totals.skipped,
            totals.orphans_removed,
        )
    return totals.to_json()


# -- the local ticker ------------------------------------------------------------------------------------


class LocalTicker:
    """A daemon thread that runs any overdue loop's pass in this process (beat need not be alive).

    ``queues``: the queues this process consumes; the ticker runs the active loops whose ticks go to
    one of them (None: every active loop). ``clock`` paces the first-pass delays (tests advance it).
    """

    def __init__(
        self,
        rt: Runtime,
        queues: Collection[str] | None = None,
        *,
        clock: loop_claims.Clock = loop_claims.SYSTEM_CLOCK,
    ) -> None:
        self.rt = rt
        self.loops = tuple(
            loop for loop in loop_registry.active(rt.settings) if queues is None or loop.queue in queues
        )
        self.clock = clock
        self._started = clock.monotonic()
        # Each loop with a first delay gets one pass that long after start, as beat gives it one.
        self._first = {
            loop.name: delay for loop, delay in loop_registry.first_passes(rt.settings) if loop in self.loops
        }
        self.tick_s = min(5.0, max(0.2, self._shortest_ms() / 2000))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="receipt-ticker", daemon=True)
        self._since: datetime | None = None
        self.passes = 0

    def _shortest_ms(self) -> int:
        now = datetime.now(UTC)
        periods = []
        for loop in self.loops:
            try:
                periods.append(loop.schedule.period_ms(self.rt.settings, now))
            except loop_registry.ScheduleError as exc:
                log.warning("local ticker leaves %s out: %s", loop.name, exc)
        return min(periods, default=10_000)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _due(self, loop: Loop, last: datetime | None, since: datetime, now: datetime) -> str | None:
        """Why the ticker runs ``loop`` now, or None."""
        delay = self._first.get(loop.name)
        if delay is not None and (self.clock.monotonic() - self._started) * 1000 >= delay:
            del self._first[loop.name]
            # An early extra pass, unless one ran since this process started (beat's, another's).
            if last is None or last < since:
                return "its first pass after start"
        if loop_registry.overdue(loop, self.rt.settings, last, since, now, TICKER_FACTOR):
            return "its last run was overdue (beat down?)"
        return None

    def tick(self) -> list[str]:
        """One look at ``loop_runs``; runs each due loop's pass and returns the names of those that ran."""
        now, runs = loop_claims.last_runs(self.rt.engine)
        if self._since is None:
            self._since = now
        ran = []
        for loop in self.loops:
            last = runs.get(loop.name)
            try:
                why = self._due(loop, last.started_at if last else None, self._since, now)
                if why is None:
                    continue
                result = run(self.rt, loop)
            except loop_registry.ScheduleError:
                continue  # logged when the ticker started; beat refuses to start on it
            except Exception:  # one loop's failure must not keep the others from running
                log.exception("local ticker: a %s pass failed", loop.name)
                continue
            if not result.get("skipped"):
                log.warning("local ticker ran %s: %s", loop.name, why)
                ran.append(loop.name)
                self.passes += 1
        return ran

    def _run(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.tick()
            except Exception as exc:  # the database may be down: look again next tick
                log.warning("local ticker could not check the loops: %s", exc)


# -- the docs table ----------------------------------------------------------------------------------

DOCS_PAGE = Path(__file__).resolve().parents[1] / "docs" / "reliability.md"
TABLE_START = "<!-- loops-table:start -->\n"
TABLE_END = "\n<!-- loops-table:end -->"


def docs_table() -> str:
    """The loop table of docs/reliability.md: the registry, with the roles consuming each queue."""
    consumers: dict[str, list[str]] = {}
    for role in ROLES.values():
        for queue in role.queues:
            consumers.setdefault(queue, []).append(role.name)
    return loop_registry.markdown_table(consumers)


def documented_table(page: Path = DOCS_PAGE) -> str:
    """The table as docs/reliability.md holds it now."""
    return page.read_text().split(TABLE_START, 1)[1].split(TABLE_END, 1)[0]


def write_docs_table(page: Path = DOCS_PAGE) -> None:
    """Regenerate the table in docs/reliability.md (``make docs``)."""
    text = page.read_text()
    head, rest = text.split(TABLE_START, 1)
    _old, tail = rest.split(TABLE_END, 1)
    page.write_text(head + TABLE_START + docs_table() + TABLE_END + tail)
