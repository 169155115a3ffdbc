"""A delivered attempt's outcome is counted, and logged at INFO only when it is not ``completed``.

The completed line is one per job on the worker's hot path; operators read the others (a lost
lease, a settlement conflict, a failure). ``receipt_attempt_outcomes_total`` counts every one.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import REGISTRY

from workers.attempts import finish
from workers.runner import AttemptResult


def outcomes(outcome: str) -> float:
    value = REGISTRY.get_sample_value("receipt_attempt_outcomes_total", {"outcome": outcome})
    return value or 0.0


def ended(status: str, job_status: str) -> AttemptResult:
    job: Any = SimpleNamespace(status=job_status, terminal=job_status in ("completed", "failed", "canceled"))
    return AttemptResult(status, job)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("status", "job_status", "level"),
    [("completed", "completed", logging.DEBUG), ("lease_lost", "running", logging.INFO)],
)
def test_each_outcome_is_counted_and_only_a_completed_one_is_logged_below_info(
    caplog: pytest.LogCaptureFixture, status: str, job_status: str, level: int
) -> None:
    before = outcomes(status)
    rt: Any = SimpleNamespace()  # neither outcome touches the runtime: nothing is left to settle
    with caplog.at_level(logging.DEBUG, logger="receipt.execute"):
        out = finish(rt, "job-1", "job-1:attempt:1", "job-1", 1, ended(status, job_status))
    assert out["status"] == status
    assert outcomes(status) == before + 1
    (record,) = [r for r in caplog.records if r.name == "receipt.execute"]
    assert record.getMessage() == f"delivery job-1:attempt:1: {status}"
    assert record.levelno == level
