"""The objective watchdog's pure rules: each reason, every boundary, the bounds and the tick ids."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from app import cron
from app.config import Settings
from app.factory import watchdog
from app.factory.reducer import Objective, Request, Task
from app.jobs.reducer import Job, Lease
from app.ops import loop_registry

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)
S = Settings()


def iso(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def task(tid: str, status: str = "queued", phase: int = 1, path: str | None = None) -> Task:
    return Task(
        id=tid,
        agent_id="codex",
        kind="factory.task.run",
        payload={},
        depends_on=(),
        dependents=(),
        execution_path=path,
        phase=phase,
        status=status,
        job_id=f"o1:p{phase}:{tid}" if status in ("queued", "running") else None,
    )


def objective(*tasks: Task, phase: int = 1, status: str = "active", pending: int = 0) -> Objective:
    return Objective(
        id="o1",
        title="t",
        goal="g",
        failure_policy="failFast",
        auth_context={},
        launched_by=None,
        task_order=tuple(t.id for t in tasks),
        tasks={t.id: t for t in tasks},
        status=status,
        phase=phase,
        pending=tuple(Request(f"r{i}", i + 2, "task_settled") for i in range(pending)),
    )


def job(
    job_id: str,
    status: str = "running",
    quiet: timedelta = timedelta(0),
    agent: str = "codex",
    **payload: Any,
) -> Job:
    lease = Lease("w1", 1, iso(NOW + timedelta(minutes=5))) if status in ("leased", "running") else None
    return Job(
        id=job_id,
        agent_id=agent,
        lane="collect",
        payload={"kind": "factory.task.run", **payload},
        session_key=None,
        singleton_mode="allow",
        max_attempts=2,
        organization_id="org",
        status=status,  # type: ignore[arg-type]
        attempt=1 if lease else 0,
        lease=lease,
        updated_at=iso(NOW - quiet),
    )


def assess(
    obj: Objective, jobs: Sequence[Job], controls: tuple[Job, ...] = (), settings: Settings = S
) -> Any:
    return watchdog.assess(obj, {j.id: j for j in jobs}, controls, NOW, settings)


# -- no_active_objective_work -------------------------------------------------------------------


def test_no_active_work_when_no_task_job_no_control_job_and_no_request() -> None:
    finding = assess(objective(task("a", "completed")), [])
    assert finding is not None and finding.reason == "no_active_objective_work"


def test_a_queued_task_whose_job_settled_or_vanished_is_no_active_work() -> None:
    settled = job("o1:p1:a", status="completed")
    assert assess(objective(task("a")), (settled,)).reason == "no_active_objective_work"
    assert assess(objective(task("a")), []).reason == "no_active_objective_work"


@pytest.mark.parametrize("status", ["queued", "leased", "running"])
def test_an_active_task_job_is_active_work(status: str) -> None:
    assert assess(objective(task("a")), [job("o1:p1:a", status=status)]) is None


def test_an_unserved_control_request_leaves_the_objective_to_control() -> None:
    assert assess(objective(task("a", "completed"), pending=1), []) is None


@pytest.mark.parametrize("status", ["queued", "leased", "running"])
def test_an_unsettled_control_job_leaves_the_objective_to_control(status: str) -> None:
    control = job("o1:control:2", status=status, agent="factory-control")
    assert assess(objective(task("a", "completed")), [], (control,)) is None
    settled = job("o1:control:2", status="completed", agent="factory-control")
    assert assess(objective(task("a", "completed")), [], (settled,)).reason == "no_active_objective_work"


@pytest.mark.parametrize("status", ["completed", "failed", "canceled"])
def test_a_terminal_objective_is_never_reconciled(status: str) -> None:
    assert assess(objective(task("a", "completed"), status=status), []) is None


# -- phase_supersession_has_active_stale_job ----------------------------------------------------


@pytest.mark.parametrize("status", ["queued", "leased", "running"])
def test_an_active_job_of_an_earlier_phase_is_reported(status: str) -> None:
    old, new = task("a", phase=1), task("b", phase=2)
    finding = assess(objective(old, new, phase=2), [job("o1:p1:a", status=status), job("o1:p2:b")])
    assert finding.reason == "phase_supersession_has_active_stale_job"
    assert finding.job_id == "o1:p1:a"


def test_a_settled_job_of_an_earlier_phase_is_not() -> None:
    old, new = task("a", phase=1), task("b", phase=2)
    assert assess(objective(old, new, phase=2), [job("o1:p1:a", "canceled"), job("o1:p2:b")]) is None


# -- active_objective_work_stalled: the threshold and its boundaries -----------------------------


def test_stall_threshold_is_two_heartbeats_of_the_jobs_lease() -> None:
    # codex default: lease 900 000 ms; heartbeat = min(900 000, 600 000) / 3 = 200 000 ms.
    assert watchdog.stall_threshold_ms(job("x"), None, S) == 2 * 200_000
    # default lease 300 000 ms: heartbeat 100 000 ms.
    assert watchdog.stall_threshold_ms(job("x", agent="e2e"), None, S) == 2 * 100_000


def test_computer_work_counts_as_stalled_only_after_15_minutes() -> None:
    assert watchdog.COMPUTER_STALL_MS == 900_000
    assert watchdog.stall_threshold_ms(job("x"), "computer", S) == 900_000
    # A lease long enough that two heartbeats exceed 15 minutes keeps its own threshold.
    slow = Settings(codex_job_lease_ms=3_600_000, active_stale_ms=3_600_000)
    assert watchdog.stall_threshold_ms(job("x"), "computer", slow) == 2 * 1_200_000


@pytest.mark.parametrize(
    ("path", "threshold_ms"), [(None, 400_000), ("local", 400_000), ("computer", 900_000)]
)
def test_stalled_exactly_past_the_threshold_not_at_it(path: str | None, threshold_ms: int) -> None:
    obj = objective(task("a", path=path))
    at = job("o1:p1:a", quiet=timedelta(milliseconds=threshold_ms))
    assert assess(obj, [at]) is None
    past = job("o1:p1:a", quiet=timedelta(milliseconds=threshold_ms + 1))
    finding = assess(obj, [past])
    assert finding.reason == "active_objective_work_stalled"
    assert (finding.job_id, finding.quiet_ms, finding.threshold_ms) == (
        "o1:p1:a",
        threshold_ms + 1,
        threshold_ms,
    )


def test_the_execution_path_on_the_job_payload_counts_too() -> None:
    quiet = job("o1:p1:a", quiet=timedelta(minutes=10), executionPath="computer")
    assert assess(objective(task("a")), [quiet]) is None


def test_a_queued_job_is_waiting_for_a_worker_not_stalled() -> None:
    assert assess(objective(task("a")), [job("o1:p1:a", "queued", quiet=timedelta(hours=2))]) is None


def test_supersession_is_reported_before_a_stall() -> None:
    old, new = task("a", phase=1), task("b", phase=2)
    stalled = job("o1:p2:b", quiet=timedelta(hours=1))
    finding = assess(objective(old, new, phase=2), [job("o1:p1:a"), stalled])
    assert finding.reason == "phase_supersession_has_active_stale_job"


def test_the_reasons_are_exactly_the_specs_three() -> None:
    assert set(watchdog.WATCHDOG_REASONS) == {
        "no_active_objective_work",
        "phase_supersession_has_active_stale_job",
        "active_objective_work_stalled",
    }


# -- bounds ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "used"), [(60_000, 60_000), (10_000, 10_000), (9_999, 10_000), (0, 10_000)]
)
def test_timeout_default_60000_floor_10000(given: int, used: int) -> None:
    assert Settings().objective_watchdog_timeout_ms == 60_000
    assert watchdog.timeout_ms(Settings(objective_watchdog_timeout_ms=given)) == used


@pytest.mark.parametrize(
    ("given", "used"), [(200, 200), (0, 1), (-5, 1), (1, 1), (2000, 2000), (2001, 2000), (10**6, 2000)]
)
def test_scan_limit_default_200_clamped_1_to_2000(given: int, used: int) -> None:
    assert Settings().objective_watchdog_scan_limit == 200
    assert watchdog.scan_limit(Settings(objective_watchdog_scan_limit=given)) == used


# -- schedule -------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["0", "false", "off", "disabled", "no"])
def test_enabled_0_turns_the_watchdog_off_and_beat_schedules_no_tick(value: str) -> None:
    off = Settings.from_env({"RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_ENABLED": value})
    assert not watchdog.enabled(off)
    assert loop_registry.OBJECTIVE_WATCHDOG.name not in loop_registry.beat_schedule(off, cron=str)
    entry = loop_registry.beat_schedule(S, cron=str)[loop_registry.OBJECTIVE_WATCHDOG.name]
    assert entry["schedule"] == "* * * * *"


@pytest.mark.parametrize("expr", ["* * * *", "* * * * * *", "61 * * * *", "every minute", ""])
def test_an_invalid_cron_is_refused_with_the_setting_named(expr: str) -> None:
    with pytest.raises(watchdog.CronError, match="RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_CRON"):
        watchdog.cron_expression(Settings(objective_watchdog_cron=expr))


def test_every_beat_firing_for_one_tick_names_the_same_job() -> None:
    expr = watchdog.cron_expression(S)
    tick = datetime(2026, 1, 1, 12, 5, tzinfo=UTC)
    ids = {
        watchdog.tick_job_id(watchdog.tick_at(expr, tick + timedelta(milliseconds=ms)))
        for ms in (0, 3, 900, 59_999)
    }
    assert ids == {"watchdog:20260101T120500Z"}
    assert (
        watchdog.tick_job_id(watchdog.tick_at(expr, tick + timedelta(seconds=60)))
        == "watchdog:20260101T120600Z"
    )
    assert cron.next_after(expr, tick) == tick + timedelta(minutes=1)


def test_the_test_tick_is_wall_clock_aligned_seconds() -> None:
    expr = watchdog.cron_expression(Settings(objective_watchdog_test_tick_s=2))
    at = datetime(2026, 1, 1, 12, 0, 3, 500_000, tzinfo=UTC)
    assert watchdog.tick_at(expr, at) == datetime(2026, 1, 1, 12, 0, 2, tzinfo=UTC)
    assert cron.next_after(expr, at) == datetime(2026, 1, 1, 12, 0, 4, tzinfo=UTC)
