"""Retention eligibility, pure: terminal age, per-organisation windows, objectives and their jobs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from app.config import Settings
from app.factory.vocab import OBJECTIVE_STREAM_PREFIX, TERMINAL_OBJECTIVE_STATUSES
from app.jobs.vocab import STATUSES, TERMINAL_STATUSES
from app.retention import archive, policy
from app.retention.policy import Ended, Policy, job_eligible, objective_eligible, owning_objectives

NOW = datetime(2026, 6, 1, tzinfo=UTC)
P = Policy(days=30)


def ended(status: str = "completed", days_ago: float = 31, org: str | None = "acme") -> Ended:
    return Ended(org, status, NOW - timedelta(days=days_ago))


@pytest.mark.parametrize("status", STATUSES)
def test_a_job_is_eligible_only_terminal_and_older_than_the_window(status: str) -> None:
    old = job_eligible(P, ended(status, 31), NOW, in_live_objective=False)
    assert old == (status in TERMINAL_STATUSES)
    assert not job_eligible(P, ended(status, 29), NOW, in_live_objective=False)
    # Exactly at the cutoff is not older than it.
    assert not job_eligible(P, ended(status, 30), NOW, in_live_objective=False)


def test_zero_keeps_everything() -> None:
    keep = Policy(days=0)
    assert not keep.enabled
    assert not job_eligible(keep, ended(days_ago=10_000), NOW, in_live_objective=False)
    assert keep.windows() == []


def test_per_organisation_windows_override_the_default() -> None:
    p = Policy(days=30, by_organization={"audited": 0, "fast": 2})
    assert p.enabled
    assert not job_eligible(p, ended(days_ago=400, org="audited"), NOW, in_live_objective=False)
    assert job_eligible(p, ended(days_ago=3, org="fast"), NOW, in_live_objective=False)
    assert not job_eligible(p, ended(days_ago=3, org="other"), NOW, in_live_objective=False)
    # A job with no organisation (written before keys were qualified) is the system's.
    assert p.window_days(None) == 30
    assert p.windows() == [(30, None, ("audited", "fast")), (2, ("fast",), ())]
    only = Policy(days=0, by_organization={"fast": 2})
    assert only.enabled and only.windows() == [(2, ("fast",), ())]


def test_a_task_job_of_a_live_objective_is_never_eligible() -> None:
    assert not job_eligible(P, ended(days_ago=10_000), NOW, in_live_objective=True)


def test_an_objective_is_eligible_only_with_all_its_jobs() -> None:
    obj = ended("completed", 31)
    assert objective_eligible(P, obj, [ended(), ended("failed"), ended("canceled")], NOW)
    assert objective_eligible(P, obj, [], NOW)
    # Its audit job still waits, or one task ended too recently: it stays, with all of them.
    assert not objective_eligible(P, obj, [ended(), ended("queued")], NOW)
    assert not objective_eligible(P, obj, [ended(), ended(days_ago=1)], NOW)
    # An active objective, or one that ended too recently, stays.
    assert not objective_eligible(P, ended("running", 300), [ended()], NOW)
    assert not objective_eligible(P, ended("completed", 1), [ended()], NOW)


def test_the_keys_a_job_could_belong_to() -> None:
    assert owning_objectives("acme/obj_1:p1:t1") == ["acme/obj_1", "acme/obj_1:p1"]
    assert owning_objectives("acme/obj_1:p1:t1:monitor")[0] == "acme/obj_1"
    assert owning_objectives("acme/plain") == []


def test_the_vocabularies_agree_with_the_factory() -> None:
    assert policy.TERMINAL_OBJECTIVE_STATUSES == TERMINAL_OBJECTIVE_STATUSES
    assert archive.OBJECTIVE_STREAM_PREFIX == OBJECTIVE_STREAM_PREFIX


def test_the_settings_give_the_policy() -> None:
    s = Settings.from_env(
        {"RECEIPT_RETENTION_DAYS": "90", "RECEIPT_RETENTION_DAYS_BY_ORGANIZATION": "a=0, b=7"}
    )
    assert Policy.from_settings(s) == Policy(90, {"a": 0, "b": 7})
    assert s.retention_enabled
    assert not Settings().retention_enabled
    for bad in ("a", "a=", "=3", "a=-1", "a=x"):
        with pytest.raises(ValueError, match="RECEIPT_RETENTION_DAYS_BY_ORGANIZATION"):
            Settings.from_env({"RECEIPT_RETENTION_DAYS_BY_ORGANIZATION": bad})
    with pytest.raises(ValueError, match="RECEIPT_RETENTION_DAYS"):
        Settings.from_env({"RECEIPT_RETENTION_DAYS": "-1"})


@pytest.mark.parametrize(
    ("worked_s", "duty", "rest_s"), [(1.0, 50, 1.0), (1.0, 25, 3.0), (0.2, 100, 0.0), (-1.0, 50, 0.0)]
)
def test_rest_keeps_the_pass_to_its_duty_percent(worked_s: float, duty: int, rest_s: float) -> None:
    """RECEIPT_ARCHIVE_DUTY_PERCENT (default 50): work is that share of the pass's time."""
    assert archive.rest_after(worked_s, duty) == pytest.approx(rest_s)
