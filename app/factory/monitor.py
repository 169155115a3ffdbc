"""The task monitor (``factory.task.monitor`` on ``factory-monitor``): follows one sandboxed task's
job until it is terminal, reporting its liveness, and asks for a reconcile if the task stalls.

For a task with ``executionPath: computer`` objective control enqueues a monitor beside the task's
job (``monitor_job_id``: deterministic, so a repeated step makes one). Its lease is the spec's row
"factory-monitor running factory.task.monitor on the computer path → max(JOB_LEASE_MS,
CODEX_JOB_LEASE_MS)" (the kind's lease row, ``app/jobs/kinds.py``), which the payload's
``executionPath`` selects.

``follow`` is the loop with its I/O passed in (read the job, the database clock, report, wait,
request a reconcile), so every branch is tested without a worker:

- the task job is terminal (or gone) → the monitor completes at once with what it saw;
- otherwise it reports ``{taskJobId, status, attempt, sinceHeartbeatMs, lastProgress,
  stallThresholdMs}`` as ``job.progress`` (only when it changed, plus once per ``REPORT_EVERY_MS``),
  then waits ``poll_ms`` (the task job's heartbeat interval, 1 to 30 s);
- a leased or running job silent past its stall threshold (``watchdog.stall_threshold_ms``: 15
  minutes on the computer path) → one ``reconcile`` request (detail
  ``active_objective_work_stalled``) and the monitor ends: control and the watchdog own the rest.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import Any, Final

from app.config import Settings
from app.factory import watchdog
from app.jobs import timing
from app.jobs.ids import client_id_of
from app.jobs.reducer import Job
from app.jobs.vocab import LEASED_STATUSES

POLL_MIN_MS: Final = 1_000
POLL_MAX_MS: Final = 30_000
# A liveness report is written when it changes, and at least this often while nothing does.
REPORT_EVERY_MS: Final = 60_000


def monitor_job_id(task_job_id: str) -> str:
    return f"{task_job_id}:monitor"


def poll_ms(job: Job, settings: Settings) -> int:
    """Look as often as the task's job heartbeats (its own cadence), 1 to 30 s."""
    lease = timing.lease_ms(job.agent_id, job.kind, job.payload, settings)
    return min(POLL_MAX_MS, max(POLL_MIN_MS, timing.heartbeat_interval_ms(lease, settings)))


def liveness(job: Job, now: datetime, settings: Settings) -> dict[str, Any]:
    """What the monitor reports about the task's job."""
    path = job.payload.get("executionPath")
    return {
        "taskJobId": job.client_id,
        "status": job.status,
        "attempt": job.attempt,
        "sinceHeartbeatMs": watchdog.quiet_ms(job, now),
        "lastProgress": job.progress,
        "stallThresholdMs": watchdog.stall_threshold_ms(
            job, path if isinstance(path, str) else None, settings
        ),
    }


def stalled(report: Mapping[str, Any]) -> bool:
    """Quiet for longer than its threshold while holding a lease (exactly the threshold is not)."""
    return report["status"] in LEASED_STATUSES and report["sinceHeartbeatMs"] > report["stallThresholdMs"]


def follow(
    task_job_id: str,
    settings: Settings,
    *,
    get_job: Callable[[str], Job | None],
    now: Callable[[], datetime],
    report: Callable[[dict[str, Any]], Any],
    wait: Callable[[float], bool],
    request_reconcile: Callable[[dict[str, Any]], Any],
) -> dict[str, Any]:
    """Follow the task's job until it is terminal or stalls (or the monitor is canceled).

    ``task_job_id`` is the job's key; what the monitor writes names it by its client id, as the
    monitor's payload does (the organisation's own id for it, the one ``/jobs/<jobId>`` takes)."""
    shown_id = client_id_of(task_job_id)
    last_key: tuple[Any, ...] | None = None
    last_report_at: datetime | None = None
    reports = 0
    while True:
        job = get_job(task_job_id)
        if job is None or job.terminal:
            return {
                "taskJobId": shown_id,
                "outcome": "terminal" if job is not None else "missing",
                "status": job.status if job is not None else None,
                "attempt": job.attempt if job is not None else None,
                "reports": reports,
            }
        at = now()
        seen = liveness(job, at, settings)
        key = (seen["status"], seen["attempt"], repr(seen["lastProgress"]), job.updated_at)
        due = last_report_at is None or (at - last_report_at).total_seconds() * 1000 >= REPORT_EVERY_MS
        if key != last_key or due:
            report(seen)
            reports += 1
            last_key, last_report_at = key, at
        if stalled(seen):
            request_reconcile(
                {
                    "reason": "active_objective_work_stalled",
                    "jobId": shown_id,
                    "quietMs": seen["sinceHeartbeatMs"],
                    "thresholdMs": seen["stallThresholdMs"],
                    "source": "task monitor",
                }
            )
            return {"taskJobId": shown_id, "outcome": "stalled", **seen, "reports": reports}
        if wait(poll_ms(job, settings) / 1000):
            return {"taskJobId": shown_id, "outcome": "canceled", "reports": reports}
