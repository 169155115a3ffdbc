"""Prometheus metrics (``prometheus_client``): process counters, and a collector reading the database.

Two kinds, documented one by one in docs/metrics.md:

- **Process counters and histograms** (enqueues, settlements, failures, lease expiries, redrives,
  delivery generations, callback failures, queue wait and run time), incremented where the event
  happens. The job events are counted by the queue's observer hook (``observe``, app/composition.py), so
  every path that appends a receipt counts the same way. In multiprocess mode
  (``PROMETHEUS_MULTIPROC_DIR``) every process writes its own files and the web process adds them
  up; that is why the metrics are created lazily (``registry_metrics``): ``prometheus_client``
  picks its storage when first imported, which must happen after the entry point set the folder.
- **State read at scrape time** (``StateCollector``): jobs by status, lane, agent and worker group
  (one grouped query over the ``jobs`` projection) and each recovery loop's last run (``loop_runs``).
  These are global: they read the database, so they are right whichever process serves them.

This module is imported by the API, the Celery tasks and the workers; it imports neither Flask nor
Celery.
"""

from __future__ import annotations

import hmac
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import func, select
from sqlalchemy.engine import Engine

from app.config import Settings
from app.dispatch import line
from app.jobs.routing import QUEUES, worker_group_for
from app.jobs.vocab import LEASED_STATUSES
from app.ops import loop_registry
from app.retention.archive import oldest_live_terminal
from app.retention.sink import DirectorySink
from app.storage.db import as_utc, db_now, jobs, loop_runs, parse_iso

if TYPE_CHECKING:
    from prometheus_client import Counter, Histogram
    from prometheus_client.registry import CollectorRegistry

    from app.retention.archive import Totals
    from app.storage.hooks import Change

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
# Queue wait spans milliseconds (a hot system) to minutes (a backlog, a redrive after 30 s).
WAIT_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900, 3600)
# Runs span a chat reply (sub-second) to a codex command (up to the one-hour lease cap).
RUN_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 1800, 3600)
# Lease starts remembered for the run-time histogram; a lease that never settles here (its
# worker died, the expiry loop ended it elsewhere) must not leak memory.
MAX_OPEN_LEASES = 10_000


@dataclass(frozen=True)
class Metrics:
    """The process metrics, created once per process on first use."""

    enqueued: Counter
    settled: Counter
    attempt_failures: Counter
    lease_expiries: Counter
    redrives: Counter
    deliveries: Counter
    generations_exhausted: Counter
    callback_failures: Counter
    queue_wait: Histogram
    org_queue_wait: Histogram
    run_time: Histogram
    loop_passes: Counter
    schedule_ticks: Counter
    schedule_lateness: Histogram
    archived_streams: Counter
    archived_receipts: Counter
    archived_bytes: Counter
    group_commit_writes: Histogram
    handed_back: Counter
    attempt_outcomes: Counter
    http_requests: Counter


# A tick fires within a pass interval (1 s) normally; a catch-up after downtime is minutes late.
LATENESS_BUCKETS = (0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300, 3600)
SCHEDULE_OUTCOMES = ("fired", "missed", "skipped", "buffered")

# A group commit carries 1 (idle) up to RECEIPT_GROUP_COMMIT_MAX (64 by default) transitions.
GROUP_COMMIT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)

# Why a worker process put fetched attempts back on their queue unstarted (``workers/attempts.py``).
HAND_BACK_REASONS = ("busy", "shutdown")

# How one attempt at a loop pass ended (``app.storage.loop_claims.run_claimed``; ``failed``: it raised).
LOOP_OUTCOMES = ("ran", "skipped", "lost", "failed")

_lock = threading.Lock()
_metrics: Metrics | None = None


def registry_metrics() -> Metrics:
    """The process metrics (created on first call, after the entry point chose the storage)."""
    global _metrics
    if _metrics is not None:
        return _metrics
    with _lock:
        if _metrics is None:
            from prometheus_client import Counter, Histogram

            _metrics = Metrics(
                enqueued=Counter(
                    "receipt_jobs_enqueued", "Jobs created (job.enqueued receipts).", ["lane", "group"]
                ),
                settled=Counter(
                    "receipt_jobs_settled",
                    "Jobs that reached a terminal status (completed, failed, canceled).",
                    ["status", "group"],
                ),
                attempt_failures=Counter(
                    "receipt_attempt_failures",
                    "Attempts that failed (job.failed receipts); outcome retried or failed (final).",
                    ["outcome", "group"],
                ),
                lease_expiries=Counter(
                    "receipt_lease_expiries", "Leases ended by the lease-expiry loop.", ["group"]
                ),
                redrives=Counter(
                    "receipt_redrives", "Deliveries the queued-job redrive started for jobs left queued."
                ),
                deliveries=Counter(
                    "receipt_deliveries_started",
                    "Deliveries (driver runs) started, by path (dispatch: enqueue, retry or requeue; "
                    "redrive: "
                    "the queued-job redrive) and whether it is a later generation of its dispatch key "
                    "(an earlier delivery of the same key ended without settling the job).",
                    ["path", "regeneration"],
                ),
                generations_exhausted=Counter(
                    "receipt_delivery_generations_exhausted",
                    "Jobs failed because their dispatch key exceeded 32 delivery generations.",
                ),
                callback_failures=Counter(
                    "receipt_callback_failures",
                    "Delivery callbacks that failed (network error or an HTTP status >= 400).",
                    ["event"],
                ),
                queue_wait=Histogram(
                    "receipt_job_queue_wait_seconds",
                    "From job.enqueued to the first job.leased (database clock).",
                    ["group"],
                    buckets=WAIT_BUCKETS,
                ),
                org_queue_wait=Histogram(
                    "receipt_organization_queue_wait_seconds",
                    "From job.enqueued to the first job.leased, per organisation (database clock): "
                    "its wait p50/p99 under fair dispatch, histogram_quantile over this.",
                    ["organization", "group"],
                    buckets=WAIT_BUCKETS,
                ),
                run_time=Histogram(
                    "receipt_job_run_seconds",
                    "From job.leased to the end of that attempt (completed, failed, canceled), measured "
                    "by the process that held the lease (database clock).",
                    ["group", "status"],
                    buckets=RUN_BUCKETS,
                ),
                schedule_ticks=Counter(
                    "receipt_schedule_ticks",
                    "Schedule ticks decided, by schedule (`<organizationId>/<scheduleId>`) and outcome: "
                    "fired, missed (outside the catch-up window), skipped (overlap policy), buffered.",
                    ["schedule", "outcome"],
                ),
                schedule_lateness=Histogram(
                    "receipt_schedule_fire_lateness_seconds",
                    "From a tick's time to its job's enqueue (database clock), for every job a "
                    "schedules pass created.",
                    buckets=LATENESS_BUCKETS,
                ),
                archived_streams=Counter(
                    "receipt_archived_streams",
                    "Streams the archiving pass moved to the archive (each leaves a tombstone), by kind: "
                    "job or objective.",
                    ["kind"],
                ),
                archived_receipts=Counter(
                    "receipt_archived_receipts",
                    "Receipts the archiving pass moved to the archive and removed from the database.",
                ),
                archived_bytes=Counter(
                    "receipt_archived_bytes",
                    "Bytes of archive segments the archiving pass wrote (compressed).",
                ),
                handed_back=Counter(
                    "receipt_attempts_handed_back",
                    "Fetched attempts a worker process put back on their queue unstarted: busy (no "
                    "slot freed within RECEIPT_DELIVERY_HOLD_MS) or shutdown.",
                    ["reason"],
                ),
                attempt_outcomes=Counter(
                    "receipt_attempt_outcomes",
                    "Delivered attempts a worker process ended, by outcome (the worker's return "
                    "status: completed, a failure status, lease_lost, settlement_conflict, "
                    "stale_attempt, terminal_state, concurrency_limited, released, ...). Counted "
                    "instead of a log line per attempt: only outcomes other than completed are logged "
                    "at INFO.",
                    ["outcome"],
                ),
                http_requests=Counter(
                    "receipt_http_requests",
                    "HTTP requests the web process answered, by method, route (the URL rule, such as "
                    "`/agents/<agentId>/jobs`; `unmatched` for no route) and status code. Counted "
                    "instead of an access line per request, which RECEIPT_ACCESS_LOG=enabled writes too.",
                    ["method", "route", "status"],
                ),
                group_commit_writes=Histogram(
                    "receipt_group_commit_writes",
                    "Job transitions each commit of this process's group commit carried (1: it "
                    "committed alone, nothing else was waiting).",
                    buckets=GROUP_COMMIT_BUCKETS,
                ),
                loop_passes=Counter(
                    "receipt_loop_passes",
                    "Recovery loop passes attempted in this process (beat's ticks and the local "
                    "ticker's), by loop and outcome: ran, skipped (another pass held or had just "
                    "run the loop), lost (stalled past its claim) or failed (raised).",
                    ["loop", "outcome"],
                ),
            )
            for kind in ("job", "objective"):
                _metrics.archived_streams.labels(kind)
            # Every declared loop's series exist from the first scrape, at zero.
            for loop in loop_registry.LOOPS:
                for outcome in LOOP_OUTCOMES:
                    _metrics.loop_passes.labels(loop.name, outcome)
    return _metrics


_open_leases: OrderedDict[tuple[str, int], datetime] = OrderedDict()


def _seconds(start: str | None, end: str | None) -> float | None:
    a, b = parse_iso(start), parse_iso(end)
    if a is None or b is None:
        return None
    return max(0.0, (b - a).total_seconds())


def observe(applied: Sequence[Change]) -> None:
    """The metrics observer hook's function: count job events from the receipts just committed."""
    m = registry_metrics()
    for item in applied:
        before, job, types = item.before, item.after, item.types
        group = worker_group_for(job.agent_id, job.kind)
        if "job.enqueued" in types:
            m.enqueued.labels(job.lane, group).inc()
        if "job.leased" in types and job.lease is not None:
            if job.attempt == 1:
                wait = _seconds(job.created_at, job.updated_at)
                if wait is not None:
                    m.queue_wait.labels(group).observe(wait)
                    m.org_queue_wait.labels(job.organization_id or "", group).observe(wait)
            with _lock:
                _open_leases[(job.id, job.attempt)] = parse_iso(job.updated_at) or datetime.now(UTC)
                while len(_open_leases) > MAX_OPEN_LEASES:
                    _open_leases.popitem(last=False)
        if "job.failed" in types:
            m.attempt_failures.labels("retried" if job.status == "queued" else "failed", group).inc()
        if "job.lease_expired" in types:
            m.lease_expiries.labels(group).inc()
        if before is not None and before.status in LEASED_STATUSES and job.status not in LEASED_STATUSES:
            with _lock:
                started = _open_leases.pop((job.id, before.attempt), None)
            ended = parse_iso(job.updated_at)
            if started is not None and ended is not None:
                outcome: str = job.status if job.status != "queued" else "retried"
                if "job.released" in types:
                    outcome = "released"  # handed back by a worker shutting down, not charged
                m.run_time.labels(group, outcome).observe(max(0.0, (ended - started).total_seconds()))
        if job.terminal and (before is None or not before.terminal):
            m.settled.labels(job.status, group).inc()


def observe_group_commit(writes: int) -> None:
    """One commit of the group commit, and how many transitions it carried."""
    registry_metrics().group_commit_writes.observe(writes)


def observe_request(method: str, route: str | None, status: int) -> None:
    """One HTTP request answered (``route``: its URL rule, None when no route matched)."""
    registry_metrics().http_requests.labels(method, route or "unmatched", str(status)).inc()


def observe_attempt(outcome: str) -> None:
    """One delivered attempt ended with this outcome (the worker's return status)."""
    registry_metrics().attempt_outcomes.labels(outcome).inc()


def observe_hand_back(reason: str, attempts: int) -> None:
    """Attempts a worker process handed back to their queue, and why (``HAND_BACK_REASONS``)."""
    registry_metrics().handed_back.labels(reason).inc(attempts)


def observe_schedules(outcomes: Mapping[str, Mapping[str, int]], late_ms: Sequence[int]) -> None:
    """A schedules pass's ticks, by schedule and outcome, and how late each new fire was."""
    m = registry_metrics()
    for schedule, counts in outcomes.items():
        for outcome, n in counts.items():
            if n:
                m.schedule_ticks.labels(schedule, outcome).inc(n)
    for ms in late_ms:
        m.schedule_lateness.observe(ms / 1000)


def observe_archive(totals: Totals) -> None:
    """What one archiving pass moved out."""
    m = registry_metrics()
    if totals.jobs:
        m.archived_streams.labels("job").inc(totals.jobs)
    if totals.objectives:
        m.archived_streams.labels("objective").inc(totals.objectives)
    if totals.receipts:
        m.archived_receipts.inc(totals.receipts)
    if totals.bytes:
        m.archived_bytes.inc(totals.bytes)


# -- state read at scrape time ---------------------------------------------------------------------


class StateCollector:
    """Jobs by status/lane/agent/group and each loop's last run, read from the database per scrape;
    with ``settings``, also each active loop's period (``app/ops/loop_registry.py``), for the
    overdue alert."""

    def __init__(self, engine: Engine, settings: Settings | None = None) -> None:
        self.engine = engine
        self.settings = settings

    def describe(self) -> list[Any]:
        return []  # unchecked collector: its families depend on what the database holds

    def collect(self) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        by_status = GaugeMetricFamily(
            "receipt_jobs",
            "Jobs in the projection, by status, lane, agent id and worker group.",
            labels=["status", "lane", "agent", "group"],
        )
        last_start = GaugeMetricFamily(
            "receipt_loop_last_started_timestamp_seconds",
            "When each recovery loop's latest pass started (loop_runs).",
            labels=["loop"],
        )
        last_success = GaugeMetricFamily(
            "receipt_loop_last_success_timestamp_seconds",
            "When each recovery loop's latest finished pass finished (loop_runs).",
            labels=["loop"],
        )
        duration = GaugeMetricFamily(
            "receipt_loop_last_duration_seconds",
            "How long each recovery loop's latest finished pass took (loop_runs).",
            labels=["loop"],
        )
        period = GaugeMetricFamily(
            "receipt_loop_interval_seconds",
            "Each recovery loop this deployment runs, and its period (the gap between two cron ticks "
            "for a cron loop); /readyz calls a loop overdue past 3 periods.",
            labels=["loop"],
        )
        oldest = GaugeMetricFamily(
            "receipt_oldest_terminal_job_age_seconds",
            "Age of the longest-ended job still in the database (since it ended): what retention has "
            "yet to take. Absent when no ended job is left.",
        )
        slots = GaugeMetricFamily(
            "receipt_dispatch_slots",
            "Each worker queue's slots offered by its live processes (docs/dispatch.md), and the most "
            "attempts the dispatch pass lets be in flight there (slots plus the lead).",
            labels=["queue", "kind"],
        )
        org_jobs = GaugeMetricFamily(
            "receipt_organization_jobs",
            "Each organisation's jobs per worker queue: queued (waiting in the line) and in flight "
            "(sent or running), as the dispatch pass counts them.",
            labels=["organization", "queue", "state"],
        )
        free = GaugeMetricFamily(
            "receipt_archive_free_bytes",
            "Free space where the archiving pass writes segments (RECEIPT_ARCHIVE_DIR), where retention "
            "is on.",
        )
        with self.engine.connect() as conn:
            ended = oldest_live_terminal(conn)
            if ended is not None:
                oldest.add_metric([], max(0.0, (db_now(conn) - ended).total_seconds()))
            counts: dict[tuple[str, str, str, str], int] = {}
            rows = conn.execute(
                select(jobs.c.status, jobs.c.lane, jobs.c.agent_id, jobs.c.kind, func.count()).group_by(
                    jobs.c.status, jobs.c.lane, jobs.c.agent_id, jobs.c.kind
                )
            ).all()
            for status, lane, agent, kind, n in rows:
                key: tuple[str, str, str, str] = (status, lane, agent, worker_group_for(agent, kind))
                counts[key] = counts.get(key, 0) + int(n)
            runs = conn.execute(
                select(loop_runs.c.name, loop_runs.c.started_at, loop_runs.c.finished_at)
            ).all()
            if self.settings is not None:
                for share in line.shares(conn, self.settings, db_now(conn), list(QUEUES.values())):
                    slots.add_metric([share.queue, "slots"], share.slots)
                    slots.add_metric([share.queue, "places"], share.places)
                    for org in share.organizations:
                        org_jobs.add_metric([org.organization, share.queue, "queued"], org.queued)
                        org_jobs.add_metric([org.organization, share.queue, "in_flight"], org.in_flight)
        for key, n in sorted(counts.items()):
            by_status.add_metric(list(key), n)
        for name, started, finished in runs:
            if started is not None:
                last_start.add_metric([name], as_utc(started).timestamp())
            # A pass in progress has cleared finished_at; its previous pass is not recorded.
            if started is not None and finished is not None and finished >= started:
                last_success.add_metric([name], as_utc(finished).timestamp())
                duration.add_metric([name], (as_utc(finished) - as_utc(started)).total_seconds())
        if self.settings is not None:
            now = datetime.now(UTC)
            for loop in loop_registry.active(self.settings):
                try:
                    period.add_metric([loop.name], loop.schedule.period_ms(self.settings, now) / 1000)
                except loop_registry.ScheduleError:
                    continue  # /readyz names it; a gauge has no value to give
        if self.settings is not None and self.settings.retention_enabled:
            space = DirectorySink(self.settings.archive_path).free_bytes()
            if space is not None:
                free.add_metric([], space)
        yield from (by_status, last_start, last_success, duration, period, oldest, free, slots, org_jobs)


def exposition(engine: Engine, settings: Settings | None = None) -> tuple[bytes, str]:
    """The text exposition: process metrics (every process's, in multiprocess mode) + database state."""
    from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    registry_metrics()  # every family appears from the first scrape, at zero
    registry: CollectorRegistry
    if os.environ.get(MULTIPROC_ENV):
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
    else:
        registry = CollectorRegistry()
        registry.register(_Delegate(REGISTRY))
    registry.register(StateCollector(engine, settings))
    return generate_latest(registry), CONTENT_TYPE_LATEST


class _Delegate:
    """Exposes another registry's metrics inside a per-scrape registry (single-process mode)."""

    def __init__(self, source: CollectorRegistry) -> None:
        self.source = source

    def describe(self) -> list[Any]:
        return []

    def collect(self) -> Iterator[Any]:
        yield from self.source.collect()


def process_registry() -> CollectorRegistry:
    """This process's metrics: the multiprocess folder's sum when one is set, else its own registry."""
    from prometheus_client import REGISTRY, CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    registry_metrics()
    if os.environ.get(MULTIPROC_ENV):
        registry = CollectorRegistry()
        MultiProcessCollector(registry)  # type: ignore[no-untyped-call]
        return registry
    return REGISTRY


_UNAUTHORIZED = (
    b'{"error":{"code":"unauthorized","message":"send Authorization: Bearer <RECEIPT_METRICS_TOKEN>"}}'
)


class WorkerEndpoint:
    """A worker process's own ``/metrics`` on ``RECEIPT_WORKER_METRICS_PORT`` (a daemon thread).

    For deployments whose workers run on hosts the web process cannot read files from. It answers
    only ``Authorization: Bearer $RECEIPT_METRICS_TOKEN`` (there is no database token check in a
    worker's hot path), and refuses to start without that token rather than serve metrics openly.
    """

    # All interfaces by default: the scraper is on another host (the token guards the endpoint).
    def __init__(self, port: int, token: str, host: str = "0.0.0.0") -> None:
        from wsgiref.simple_server import WSGIRequestHandler, make_server

        from prometheus_client import make_wsgi_app

        class _Quiet(WSGIRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return None  # one line per scrape would drown the worker's own log

        inner = make_wsgi_app(process_registry())
        expected = token.encode()

        def app(environ: dict[str, Any], start_response: Any) -> Any:
            scheme, _, secret = str(environ.get("HTTP_AUTHORIZATION", "")).partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(secret.strip().encode(), expected):
                body = _UNAUTHORIZED
                start_response(
                    "401 Unauthorized",
                    [("Content-Type", "application/json"), ("WWW-Authenticate", 'Bearer realm="receipt"')],
                )
                return [body]
            if environ.get("PATH_INFO") != "/metrics":
                start_response("404 Not Found", [("Content-Type", "application/json")])
                return [b'{"error":{"code":"not_found","message":"no such route"}}']
            return inner(environ, start_response)

        self.server = make_server(host, port, app, handler_class=_Quiet)
        self.port = int(self.server.server_port)
        self.thread = threading.Thread(target=self.server.serve_forever, name="metrics-endpoint", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def start_worker_endpoint(port: int | None, token: str | None) -> WorkerEndpoint | None:
    """Start the worker's endpoint when ``RECEIPT_WORKER_METRICS_PORT`` is set (needs the token)."""
    if port is None:
        return None
    if not token:
        raise SystemExit(
            "RECEIPT_WORKER_METRICS_PORT is set but RECEIPT_METRICS_TOKEN is not: the endpoint would be "
            "open to anyone; set the token (the scraper sends it as its bearer token)"
        )
    return WorkerEndpoint(port, token)


def prepare_multiprocess_dir(default: str | None) -> str | None:
    """Make sure ``PROMETHEUS_MULTIPROC_DIR`` names an existing folder when one is wanted.

    Kept (not emptied) when already set: whoever set it owns it (``receipt up`` empties its
    folder at start). Otherwise ``default`` is created and used. Returns the folder in use.
    """
    current = os.environ.get(MULTIPROC_ENV)
    folder = current or default
    if folder is None:
        return None
    os.makedirs(folder, exist_ok=True)
    os.environ[MULTIPROC_ENV] = folder
    return folder


def mark_process_dead(pid: int) -> None:
    """gunicorn ``child_exit``: drop a dead worker's live-gauge files (counters are kept)."""
    if os.environ.get(MULTIPROC_ENV):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]
