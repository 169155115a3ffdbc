"""The lease, execution timeout, heartbeat cadence and driver timeout of a job, from its facts and
Settings."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from app.config import Settings
from app.jobs.kinds import KINDS, LeaseRow
from app.jobs.vocab import AGENT_CODEX

# -- the spec's rules (the configurable defaults live in app.config.Settings) -------------------
# Spec: codex lease is "the payload timeout plus 300 000 ms, capped at 3 600 000 ms".
CODEX_PAYLOAD_TIMEOUT_PAD_MS: Final = 300_000
CODEX_LEASE_CAP_MS: Final = 3_600_000
# Spec: "The execution timeout is the lease minus 1 000 ms, with a floor of 5 000 ms."
EXECUTION_TIMEOUT_MARGIN_MS: Final = 1_000
EXECUTION_TIMEOUT_FLOOR_MS: Final = 5_000
# Spec: heartbeat is "one third of the smaller of the lease and RECEIPT_RESONATE_ACTIVE_STALE_MS,
# floored at 1 000 ms" — three so a worker has two renewal opportunities before the fence fires.
HEARTBEAT_DIVISOR: Final = 3
HEARTBEAT_FLOOR_MS: Final = 1_000
# Spec: "The driver's own invocation timeout is the lease plus 60 000 ms, with a floor of 120 000 ms."
DRIVER_TIMEOUT_PAD_MS: Final = 60_000
DRIVER_TIMEOUT_FLOOR_MS: Final = 120_000

# The codex job's own timeout, in milliseconds, on its payload.
PAYLOAD_TIMEOUT_FIELD: Final = "timeout"


@dataclass(frozen=True)
class JobTiming:
    """Every duration one delivery of a job runs under, in milliseconds."""

    lease_ms: int
    execution_timeout_ms: int
    heartbeat_interval_ms: int
    driver_timeout_ms: int


def payload_timeout_ms(payload: Mapping[str, Any]) -> int | None:
    """The payload's own timeout in ms, or None when absent or not a positive integer."""
    value = payload.get(PAYLOAD_TIMEOUT_FIELD)
    # bool is an int subclass; `true` is not a timeout. Zero/negative mean "no timeout asked for".
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


def kind_row(agent_id: str, kind: str, payload: Mapping[str, Any]) -> LeaseRow | None:
    """The kind's own row of the lease table (``app.jobs.kinds``), when it applies to this job: the
    job is posted to the kind's own agent and its payload matches the row."""
    declared = KINDS.get(kind)
    if declared is None or declared.lease is None or agent_id != declared.agent:
        return None
    return declared.lease if declared.lease.matches(payload) else None


def lease_ms(agent_id: str, kind: str, payload: Mapping[str, Any], settings: Settings) -> int:
    """The job's lease, per the spec's lease table (section "Leases, timeouts and heartbeats")."""
    return _lease_ms(agent_id, payload, settings, kind_row(agent_id, kind, payload))


def _lease_ms(agent_id: str, payload: Mapping[str, Any], settings: Settings, row: LeaseRow | None) -> int:
    default = settings.job_lease_ms
    # The kinds' own rows: factory-control running factory.objective.control -> max(default,
    # FACTORY_CONTROL_JOB_LEASE_MS); factory-monitor running factory.task.monitor on the computer
    # path -> max(default, CODEX_JOB_LEASE_MS).
    if row is not None:
        return max(default, int(getattr(settings, row.floor)))
    # Row: codex, whatever the kind -> the larger of CODEX_JOB_LEASE_MS and payload timeout + 300 000,
    # capped at 3 600 000; with no payload timeout, CODEX_JOB_LEASE_MS.
    if agent_id == AGENT_CODEX:
        timeout = payload_timeout_ms(payload)
        if timeout is None:
            return settings.codex_job_lease_ms
        # The cap bounds what a *payload* may ask for; it never cuts below the operator's
        # CODEX_JOB_LEASE_MS. So a payload timeout can only raise the lease (monotone), and a
        # CODEX_JOB_LEASE_MS above the cap means the same with or without a payload timeout.
        # Identical to min(cap, max(...)) whenever CODEX_JOB_LEASE_MS <= cap (the default).
        return max(
            settings.codex_job_lease_ms, min(timeout + CODEX_PAYLOAD_TIMEOUT_PAD_MS, CODEX_LEASE_CAP_MS)
        )
    # Row: default -> JOB_LEASE_MS.
    return default


def execution_timeout_ms(agent_id: str, kind: str, payload: Mapping[str, Any], settings: Settings) -> int:
    """How long the handler may run: the lease minus 1 000 ms, floored at 5 000 ms."""
    row = kind_row(agent_id, kind, payload)
    return _execution_timeout_ms(_lease_ms(agent_id, payload, settings, row), settings, row)


def _execution_timeout_ms(lease: int, settings: Settings, row: LeaseRow | None) -> int:
    timeout = lease - EXECUTION_TIMEOUT_MARGIN_MS
    cap = getattr(settings, row.execution_timeout_cap) if row and row.execution_timeout_cap else None
    # Spec: FACTORY_CONTROL_JOB_EXECUTION_TIMEOUT_MS "may lower it, for objective control only" (the
    # one row that names a cap) — min() so it can never raise the timeout past the lease it must
    # finish inside.
    if cap is not None:
        timeout = min(timeout, int(cap))
    # The floor is applied last, so even an override of 0 leaves a handler 5 000 ms to run.
    return max(EXECUTION_TIMEOUT_FLOOR_MS, timeout)


def heartbeat_interval_ms(lease_ms: int, settings: Settings) -> int:
    """How often a running job renews its lease: a third of min(lease, active-stale), floored at 1 000 ms."""
    interval = min(lease_ms, settings.active_stale_ms) // HEARTBEAT_DIVISOR
    override = settings.heartbeat_interval_ms
    # Spec: RECEIPT_RESONATE_HEARTBEAT_INTERVAL_MS "can only lower that derived value, never raise it".
    if override is not None:
        interval = min(interval, override)
    # The floor is applied last: a tiny or zero override must not turn the heartbeat loop into a
    # busy loop of receipt appends.
    return max(HEARTBEAT_FLOOR_MS, interval)


def driver_timeout_ms(lease_ms: int) -> int:
    """The driver's own invocation timeout: the lease plus 60 000 ms, floored at 120 000 ms."""
    return max(DRIVER_TIMEOUT_FLOOR_MS, lease_ms + DRIVER_TIMEOUT_PAD_MS)


def timing_for(agent_id: str, kind: str, payload: Mapping[str, Any], settings: Settings) -> JobTiming:
    """All four durations of a job, each derived from the one lease."""
    row = kind_row(agent_id, kind, payload)
    lease = _lease_ms(agent_id, payload, settings, row)
    return JobTiming(
        lease_ms=lease,
        execution_timeout_ms=_execution_timeout_ms(lease, settings, row),
        heartbeat_interval_ms=heartbeat_interval_ms(lease, settings),
        driver_timeout_ms=driver_timeout_ms(lease),
    )


def retry_delay_ms(failed_attempt: int, settings: Settings) -> int:
    """Delay before retrying after ``failed_attempt`` failed retryably: exponential, capped.

    ``RECEIPT_RETRY_BACKOFF_MS`` * 2^(attempt - 1), at most ``RECEIPT_RETRY_BACKOFF_MAX_MS``; a base
    of 0 retries at once. The spec is silent here; every production job system backs off.
    """
    base = max(0, settings.retry_backoff_ms)
    if base == 0 or failed_attempt < 1:
        return 0
    delay: int = base * 2 ** min(failed_attempt - 1, 30)
    return min(max(0, settings.retry_backoff_max_ms), delay)
