"""The task monitor's loop (``app.factory.monitor.follow``) with its I/O faked: every branch."""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

from app.config import Settings
from app.factory import monitor
from app.jobs.reducer import Job
from tests.unit.test_watchdog import NOW, job

S = Settings()


class Fake:
    def __init__(self, states: list[Job | None]) -> None:
        self.states = states
        self.reports: list[dict[str, Any]] = []
        self.reconciles: list[dict[str, Any]] = []
        self.waits: list[float] = []
        self.cancel_after: int | None = None

    def get(self, _job_id: str) -> Job | None:
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        return self.cancel_after is not None and len(self.waits) >= self.cancel_after

    def run(self) -> dict[str, Any]:
        return monitor.follow(
            "o1:p1:a",
            S,
            get_job=self.get,
            now=lambda: NOW,
            report=self.reports.append,
            wait=self.wait,
            request_reconcile=self.reconciles.append,
        )


def computer(status: str = "running", quiet: timedelta = timedelta(0), **kw: Any) -> Job:
    return job("o1:p1:a", status=status, quiet=quiet, executionPath="computer", **kw)


def test_an_already_terminal_task_completes_the_monitor_at_once() -> None:
    fake = Fake([computer("completed")])
    assert fake.run() == {
        "taskJobId": "o1:p1:a",
        "outcome": "terminal",
        "status": "completed",
        "attempt": 0,
        "reports": 0,
    }
    assert fake.reports == [] and fake.waits == []


def test_a_missing_task_job_ends_the_monitor() -> None:
    assert Fake([None]).run()["outcome"] == "missing"


def test_follows_until_terminal_reporting_liveness_only_when_it_changes() -> None:
    running = computer(quiet=timedelta(seconds=30))
    progressed = replace(running, progress={"step": 2}, updated_at="2026-01-01T11:59:50.000000Z")
    fake = Fake([running, running, progressed, computer("failed")])
    result = fake.run()
    assert result["outcome"] == "terminal" and result["status"] == "failed" and result["reports"] == 2
    first, second = fake.reports
    assert first == {
        "taskJobId": "o1:p1:a",
        "status": "running",
        "attempt": 1,
        "sinceHeartbeatMs": 30_000,
        "lastProgress": None,
        "stallThresholdMs": 900_000,
    }
    assert second["lastProgress"] == {"step": 2} and second["sinceHeartbeatMs"] == 10_000
    # It looks as often as the task heartbeats: codex lease 900 s -> heartbeat 200 s, capped at 30 s.
    assert fake.waits == [30.0, 30.0, 30.0]
    assert fake.reconciles == []


def test_a_computer_task_stalls_only_past_15_minutes_then_one_reconcile_and_the_monitor_ends() -> None:
    at_threshold = Fake([computer(quiet=timedelta(minutes=15))])
    at_threshold.cancel_after = 1
    assert at_threshold.run()["outcome"] == "canceled" and at_threshold.reconciles == []
    past = Fake([computer(quiet=timedelta(minutes=15, milliseconds=1))])
    result = past.run()
    assert result["outcome"] == "stalled" and past.waits == []
    assert past.reconciles == [
        {
            "reason": "active_objective_work_stalled",
            "jobId": "o1:p1:a",
            "quietMs": 900_001,
            "thresholdMs": 900_000,
            "source": "task monitor",
        }
    ]


def test_a_queued_task_is_waited_for_not_stalled() -> None:
    fake = Fake([computer("queued", quiet=timedelta(hours=3))])
    fake.cancel_after = 2
    assert fake.run()["outcome"] == "canceled" and fake.reconciles == []


def test_what_it_writes_names_the_task_job_by_its_client_id_not_its_key() -> None:
    """The monitor follows the job's key; its reports, reconcile detail and result name the job as
    its payload does (the organisation's id for it), never by the organisation-qualified key."""
    stalled_job = job("org/o1:p1:a", quiet=timedelta(minutes=15, milliseconds=1), executionPath="computer")
    asked: list[str] = []
    reports: list[dict[str, Any]] = []
    reconciles: list[dict[str, Any]] = []

    def get(job_id: str) -> Job | None:
        asked.append(job_id)
        return stalled_job

    result = monitor.follow(
        "org/o1:p1:a",
        S,
        get_job=get,
        now=lambda: NOW,
        report=reports.append,
        wait=lambda _s: False,
        request_reconcile=reconciles.append,
    )
    assert asked == ["org/o1:p1:a"]  # it reads by key
    assert result["outcome"] == "stalled" and result["taskJobId"] == "o1:p1:a"
    assert [r["taskJobId"] for r in reports] == ["o1:p1:a"]
    assert [r["jobId"] for r in reconciles] == ["o1:p1:a"]
