"""The objective watchdog's rules: which active objective needs a ``reconcile`` and why, its bounds,
its schedule and the job id of one cron tick. Pure: no I/O, no clock (``now`` is passed in).

Spec ("Four independent recovery loops"): the watchdog reconciles an objective for exactly one of
three reasons, checked in this order:

1. ``phase_supersession_has_active_stale_job`` — a task job of an earlier phase than the
   objective's current one is still queued, leased or running;
2. ``active_objective_work_stalled`` — a leased or running task job has shown no sign of life (no
   receipt: heartbeat, progress, lease) for longer than its stall threshold (below);
3. ``no_active_objective_work`` — the objective is active, but no task job is queued, leased or
   running, no control job is queued, leased or running, and no control request is unserved.

An objective whose control is already due (an unserved request, or a control job not yet settled)
is left to that control: reasons 1 and 2 are facts control will see on its own, and writing a
second request would only queue a second step behind the first.

**Stall threshold.** A running job renews its lease every heartbeat interval (``app/jobs/timing.py``:
a third of min(lease, RECEIPT_RESONATE_ACTIVE_STALE_MS), floored at 1 000 ms), so two missed
heartbeats mean the lease is about to lapse with the worker silent: the threshold is
``STALL_HEARTBEATS`` times the job's heartbeat interval (default job: 2 x 100 s = 200 s). Sandboxed
execution (``executionPath: computer``) counts as stalled only after ``COMPUTER_STALL_MS``
(15 minutes, spec), or its two heartbeats if longer: a computer-backed task can be quiet while its
workspace syncs. Quiet for exactly the threshold is not stalled; one millisecond more is.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Literal, get_args

from app import cron
from app.config import Settings
from app.factory.reducer import Objective, Task
from app.jobs import timing
from app.jobs.reducer import Job
from app.jobs.vocab import ACTIVE_STATUSES, LEASED_STATUSES

WatchdogReason = Literal[
    "phase_supersession_has_active_stale_job",
    "active_objective_work_stalled",
    "no_active_objective_work",
]
WATCHDOG_REASONS: Final[tuple[str, ...]] = get_args(WatchdogReason)

# Spec: "Sandboxed execution is treated as stale only after 15 minutes".
COMPUTER_STALL_MS: Final = 15 * 60_000
COMPUTER_EXECUTION_PATH: Final = "computer"
# Two missed heartbeats: a worker had two chances to renew and took neither.
STALL_HEARTBEATS: Final = 2
# Spec: "its timeout defaults to 60 000 ms with a 10 000 ms floor, and its scan limit to 200,
# clamped to 1..2000" (the defaults live in app.config).
TIMEOUT_FLOOR_MS: Final = 10_000
SCAN_LIMIT_MIN: Final = 1
SCAN_LIMIT_MAX: Final = 2000
CRON_FIELDS: Final = 5


def timeout_ms(settings: Settings) -> int:
    """The pass's deadline: RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_TIMEOUT_MS, floored at 10 000 ms."""
    return max(TIMEOUT_FLOOR_MS, settings.objective_watchdog_timeout_ms)


def scan_limit(settings: Settings) -> int:
    """Objectives read per page: RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_SCAN_LIMIT clamped to 1..2000."""
    return min(SCAN_LIMIT_MAX, max(SCAN_LIMIT_MIN, settings.objective_watchdog_scan_limit))


def enabled(settings: Settings) -> bool:
    """``RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_ENABLED`` off (``0``, ``disabled``...) turns the watchdog off."""
    return settings.objective_watchdog_enabled


# -- the decision ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """Why one objective is reconciled (and the job that shows it, when one does)."""

    objective_id: str
    reason: str
    job_id: str | None = None
    quiet_ms: int | None = None
    threshold_ms: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"objectiveId": self.objective_id, "reason": self.reason}
        if self.job_id is not None:
            out["jobId"] = self.job_id
        if self.quiet_ms is not None:
            out["quietMs"] = self.quiet_ms
            out["thresholdMs"] = self.threshold_ms
        return out


def _parse(at: str | None) -> datetime | None:
    if not at:
        return None
    parsed = datetime.fromisoformat(at.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def stall_threshold_ms(job: Job, execution_path: str | None, settings: Settings) -> int:
    """How long a leased or running job may stay silent before it counts as stalled."""
    lease = timing.lease_ms(job.agent_id, job.kind, job.payload, settings)
    threshold = STALL_HEARTBEATS * timing.heartbeat_interval_ms(lease, settings)
    if execution_path == COMPUTER_EXECUTION_PATH:
        return max(threshold, COMPUTER_STALL_MS)
    return threshold


def quiet_ms(job: Job, now: datetime) -> int:
    """Milliseconds since the job's last receipt (its last sign of life)."""
    last = _parse(job.updated_at)
    if last is None:
        return 0
    return max(0, int((now - last) / timedelta(milliseconds=1)))


def _execution_path(task: Task, job: Job) -> str | None:
    path = task.execution_path or job.payload.get("executionPath")
    return path if isinstance(path, str) else None


def assess(
    obj: Objective,
    task_jobs: Mapping[str, Job | None],
    control_jobs: Sequence[Job],
    now: datetime,
    settings: Settings,
) -> Finding | None:
    """The watchdog's verdict on one objective, or None when it needs nothing.

    ``obj.tasks`` must hold at least every task whose status is ``queued`` or ``running`` (the ones
    with a job); ``task_jobs`` maps their job ids to the jobs (None: the job does not exist);
    ``control_jobs`` are this objective's control jobs that have not settled.
    """
    if obj.terminal:
        return None
    if obj.pending or any(not j.terminal for j in control_jobs):
        return None  # control is already due: it will look
    active: list[tuple[Task, Job]] = []
    for task_id in sorted(obj.tasks):
        task = obj.tasks[task_id]
        job = task_jobs.get(task.job_id) if task.job_id else None
        if job is not None and job.status in ACTIVE_STATUSES:
            active.append((task, job))
    for task, job in active:
        if task.phase < obj.phase:
            return Finding(obj.id, "phase_supersession_has_active_stale_job", job.id)
    for task, job in active:
        if job.status not in LEASED_STATUSES:
            continue
        quiet = quiet_ms(job, now)
        threshold = stall_threshold_ms(job, _execution_path(task, job), settings)
        if quiet > threshold:
            return Finding(obj.id, "active_objective_work_stalled", job.id, quiet, threshold)
    if not active:
        return Finding(obj.id, "no_active_objective_work")
    return None


# -- the schedule ------------------------------------------------------------------------------


class CronError(cron.CronError):
    """RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_CRON is not a standard 5-field cron expression."""


def cron_expression(settings: Settings) -> str:
    """The watchdog's cron expression, checked: standard 5 fields (minute hour day-of-month month
    day-of-week), read in UTC by the cron engine (``app/cron.py``).

    ``RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_TEST_TICK_S`` (tests only) replaces it with a tick every
    N seconds, aligned to the wall clock (the engine's leading seconds field), so end-to-end tests
    need not wait a minute per tick.
    """
    if settings.objective_watchdog_test_tick_s is not None:
        tick = settings.objective_watchdog_test_tick_s
        if not 1 <= tick <= 59:
            raise CronError(f"RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_TEST_TICK_S must be 1..59, got {tick}")
        return f"*/{tick} * * * * *"
    try:
        expr = cron.check(settings.objective_watchdog_cron)
    except cron.CronError:
        expr = None
    if expr is None or cron.field_count(expr) != CRON_FIELDS:
        raise CronError(
            f"RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_CRON={settings.objective_watchdog_cron!r} is not a "
            "standard 5-field cron expression (minute hour day-of-month month day-of-week, e.g. '* * * * *')"
        )
    return expr


def tick_at(expr: str, published: datetime) -> datetime:
    """The cron tick a watchdog run belongs to: the latest tick at or before ``published`` in UTC
    (beat publishes at or just after its tick, so every beat firing for one tick names the same one)."""
    return cron.latest_at_or_before(expr, published)


def tick_job_id(tick: datetime) -> str:
    """One watchdog job per cron tick: a second beat's enqueue for the same tick is a no-op."""
    return f"watchdog:{tick.astimezone(UTC).strftime('%Y%m%dT%H%M%SZ')}"
