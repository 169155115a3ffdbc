"""Leases, timeouts and heartbeats (spec: "Leases, timeouts and heartbeats")."""

from __future__ import annotations

from typing import Any

import pytest

from app.config import Settings
from app.jobs import timing
from app.jobs.timing import (
    JobTiming,
    driver_timeout_ms,
    execution_timeout_ms,
    heartbeat_interval_ms,
    lease_ms,
    payload_timeout_ms,
    timing_for,
)


def settings(env: dict[str, str] | None = None) -> Settings:
    """Settings from an explicit env dict only, never the process environment."""
    return Settings.from_env(env or {})


OBJECTIVE_CONTROL = ("factory-control", "factory.objective.control")
COMPUTER = {"executionPath": "computer"}


@pytest.mark.parametrize(
    ("agent_id", "kind", "payload", "env", "expected"),
    [
        # Row "Default": JOB_LEASE_MS, default 300 000 ms
        pytest.param("factory", "factory.run", {}, {}, 300_000, id="default JOB_LEASE_MS 300000"),
        pytest.param(
            "factory",
            "factory.dispatch",
            {},
            {"JOB_LEASE_MS": "120000"},
            120_000,
            id="default follows JOB_LEASE_MS",
        ),
        pytest.param("nobody", "factory.run", {}, {}, 300_000, id="unknown agent gets the default"),
        pytest.param(
            "factory-monitor",
            "factory.task.monitor",
            {},
            {},
            300_000,
            id="monitor without executionPath gets the default",
        ),
        pytest.param(
            "factory-monitor",
            "factory.task.monitor",
            {"executionPath": "worktree"},
            {},
            300_000,
            id="monitor off the computer path gets the default",
        ),
        pytest.param(
            "factory-monitor",
            "factory.task.run",
            COMPUTER,
            {},
            300_000,
            id="computer path counts only for factory.task.monitor",
        ),
        pytest.param(
            "factory",
            "factory.task.monitor",
            COMPUTER,
            {},
            300_000,
            id="computer path counts only on agent factory-monitor",
        ),
        pytest.param(
            "factory-control",
            "factory.objective.audit",
            {},
            {},
            300_000,
            id="factory-control lease is for factory.objective.control only",
        ),
        pytest.param(
            "factory",
            "factory.objective.control",
            {},
            {},
            300_000,
            id="objective control lease is for agent factory-control only",
        ),
        # Row "factory-control running factory.objective.control": larger of default and 900 000
        pytest.param(
            *OBJECTIVE_CONTROL, {}, {}, 900_000, id="objective control FACTORY_CONTROL_JOB_LEASE_MS 900000"
        ),
        pytest.param(
            *OBJECTIVE_CONTROL,
            {},
            {"FACTORY_CONTROL_JOB_LEASE_MS": "1200000"},
            1_200_000,
            id="objective control follows FACTORY_CONTROL_JOB_LEASE_MS",
        ),
        pytest.param(
            *OBJECTIVE_CONTROL,
            {},
            {"FACTORY_CONTROL_JOB_LEASE_MS": "100000"},
            300_000,
            id="objective control: the larger of the default and FACTORY_CONTROL_JOB_LEASE_MS",
        ),
        pytest.param(
            *OBJECTIVE_CONTROL,
            {},
            {"JOB_LEASE_MS": "1000000"},
            1_000_000,
            id="objective control: a larger JOB_LEASE_MS wins",
        ),
        # Row "factory-monitor running factory.task.monitor with executionPath computer"
        pytest.param(
            "factory-monitor",
            "factory.task.monitor",
            COMPUTER,
            {},
            900_000,
            id="computer monitor CODEX_JOB_LEASE_MS 900000",
        ),
        pytest.param(
            "factory-monitor",
            "factory.task.monitor",
            COMPUTER,
            {"CODEX_JOB_LEASE_MS": "100000"},
            300_000,
            id="computer monitor: the larger of the default and CODEX_JOB_LEASE_MS",
        ),
        pytest.param(
            "factory-monitor",
            "factory.task.monitor",
            COMPUTER,
            {"JOB_LEASE_MS": "1000000"},
            1_000_000,
            id="computer monitor: a larger JOB_LEASE_MS wins",
        ),
        # Row "codex": larger of CODEX_JOB_LEASE_MS and payload timeout + 300 000, capped at 3 600 000
        pytest.param(
            "codex",
            "factory.task.run",
            {},
            {},
            900_000,
            id="codex with no payload timeout: CODEX_JOB_LEASE_MS",
        ),
        pytest.param(
            "codex",
            "factory.task.run",
            {},
            {"CODEX_JOB_LEASE_MS": "60000"},
            60_000,
            id="codex with no payload timeout is exactly CODEX_JOB_LEASE_MS (not maxed with JOB_LEASE_MS)",
        ),
        pytest.param(
            "codex", "factory.task.run", {"timeout": 1}, {}, 900_000, id="codex timeout 1 -> 900000"
        ),
        pytest.param(
            "codex",
            "factory.task.run",
            {"timeout": 600_000},
            {},
            900_000,
            id="codex timeout 600000 + 300000 ties CODEX_JOB_LEASE_MS",
        ),
        pytest.param(
            "codex",
            "factory.task.run",
            {"timeout": 600_001},
            {},
            900_001,
            id="codex timeout 600001 -> 900001",
        ),
        pytest.param(
            "codex",
            "factory.task.run",
            {"timeout": 3_300_000},
            {},
            3_600_000,
            id="codex timeout 3300000 reaches the 3600000 cap exactly",
        ),
        pytest.param(
            "codex",
            "factory.task.run",
            {"timeout": 3_400_000},
            {},
            3_600_000,
            id="codex timeout 3400000 capped at 3600000",
        ),
        pytest.param(
            "codex",
            "factory.run",
            {"timeout": 1_000_000},
            {},
            1_300_000,
            id="codex row applies whatever the kind",
        ),
        pytest.param(
            "codex",
            "factory.task.run",
            {"timeout": 1_000},
            {"CODEX_JOB_LEASE_MS": "4000000"},
            4_000_000,
            id="the cap bounds the payload timeout, never an operator CODEX_JOB_LEASE_MS",
        ),
        pytest.param(
            "codex",
            "factory.task.run",
            {},
            {"CODEX_JOB_LEASE_MS": "4000000"},
            4_000_000,
            id="codex with no payload timeout is CODEX_JOB_LEASE_MS even above the cap",
        ),
    ],
)
def test_lease_table(
    agent_id: str, kind: str, payload: dict[str, Any], env: dict[str, str], expected: int
) -> None:
    """Spec lease table: default / factory-control objective control / computer monitor / codex."""
    assert lease_ms(agent_id, kind, payload, settings(env)) == expected


@pytest.mark.parametrize(
    "value",
    [True, False, "600000", 1_500_000.0, 0, -5, None, [1], {"ms": 1}],
    ids=repr,
)
def test_a_payload_timeout_must_be_a_positive_int(value: object) -> None:
    """Codex "with no payload timeout it is CODEX_JOB_LEASE_MS": non-int, bool and <= 0 are no timeout."""
    assert payload_timeout_ms({"timeout": value}) is None
    assert lease_ms("codex", "factory.task.run", {"timeout": value}, settings()) == 900_000


@pytest.mark.parametrize(
    ("job_lease", "expected"),
    [
        pytest.param(300_000, 299_000, id="lease 300000 -> 299000 (lease minus 1000)"),
        pytest.param(6_001, 5_001, id="lease 6001 -> 5001"),
        pytest.param(6_000, 5_000, id="lease 6000 -> 5000"),
        pytest.param(5_999, 5_000, id="lease 5999 -> floor 5000"),
        pytest.param(1_000, 5_000, id="lease 1000 -> floor 5000"),
    ],
)
def test_execution_timeout_is_lease_minus_1000_floored_at_5000(job_lease: int, expected: int) -> None:
    """Spec: "The execution timeout is the lease minus 1 000 ms, with a floor of 5 000 ms"."""
    env = {"JOB_LEASE_MS": str(job_lease)}
    assert execution_timeout_ms("factory", "factory.run", {}, settings(env)) == expected


@pytest.mark.parametrize(
    ("agent_id", "kind", "payload", "env", "expected"),
    [
        pytest.param(
            *OBJECTIVE_CONTROL, {}, {}, 899_000, id="objective control without override: 900000 - 1000"
        ),
        pytest.param(
            *OBJECTIVE_CONTROL,
            {},
            {"FACTORY_CONTROL_JOB_EXECUTION_TIMEOUT_MS": "60000"},
            60_000,
            id="override lowers objective control",
        ),
        pytest.param(
            *OBJECTIVE_CONTROL,
            {},
            {"FACTORY_CONTROL_JOB_EXECUTION_TIMEOUT_MS": "2000000"},
            899_000,
            id="override raising is ignored",
        ),
        pytest.param(
            *OBJECTIVE_CONTROL,
            {},
            {"FACTORY_CONTROL_JOB_EXECUTION_TIMEOUT_MS": "1000"},
            5_000,
            id="floor 5000 applies after the override",
        ),
        pytest.param(
            *OBJECTIVE_CONTROL,
            {},
            {"FACTORY_CONTROL_JOB_EXECUTION_TIMEOUT_MS": "0"},
            5_000,
            id="override 0 still leaves the 5000 floor",
        ),
        pytest.param(
            "factory",
            "factory.run",
            {},
            {"FACTORY_CONTROL_JOB_EXECUTION_TIMEOUT_MS": "60000"},
            299_000,
            id="override is for objective control only (other agent)",
        ),
        pytest.param(
            "factory-control",
            "factory.objective.audit",
            {},
            {"FACTORY_CONTROL_JOB_EXECUTION_TIMEOUT_MS": "60000"},
            299_000,
            id="override is for objective control only (other kind)",
        ),
        pytest.param(
            "codex",
            "factory.task.run",
            {"timeout": 3_400_000},
            {},
            3_599_000,
            id="codex capped lease 3600000 -> 3599000",
        ),
        pytest.param(
            "factory-monitor",
            "factory.task.monitor",
            COMPUTER,
            {},
            899_000,
            id="computer monitor 900000 -> 899000",
        ),
    ],
)
def test_execution_timeout_override_only_lowers_objective_control(
    agent_id: str, kind: str, payload: dict[str, Any], env: dict[str, str], expected: int
) -> None:
    """Spec: "`FACTORY_CONTROL_JOB_EXECUTION_TIMEOUT_MS` may lower it, for objective control only"."""
    assert execution_timeout_ms(agent_id, kind, payload, settings(env)) == expected


@pytest.mark.parametrize(
    ("lease", "env", "expected"),
    [
        pytest.param(300_000, {}, 100_000, id="lease 300000 -> a third, 100000"),
        pytest.param(900_000, {}, 200_000, id="lease 900000 -> a third of ACTIVE_STALE 600000"),
        pytest.param(3_600_000, {}, 200_000, id="capped codex lease -> a third of ACTIVE_STALE 600000"),
        pytest.param(600_000, {}, 200_000, id="lease equal to ACTIVE_STALE"),
        pytest.param(300_001, {}, 100_000, id="a third rounds down"),
        pytest.param(
            300_000,
            {"RECEIPT_RESONATE_ACTIVE_STALE_MS": "30000"},
            10_000,
            id="smaller RECEIPT_RESONATE_ACTIVE_STALE_MS wins",
        ),
        pytest.param(2_999, {}, 1_000, id="tiny lease -> floor 1000"),
        pytest.param(3_000, {}, 1_000, id="lease 3000 -> exactly 1000"),
        pytest.param(3_003, {}, 1_001, id="lease 3003 -> 1001"),
        pytest.param(
            300_000, {"RECEIPT_RESONATE_HEARTBEAT_INTERVAL_MS": "5000"}, 5_000, id="override lowering works"
        ),
        pytest.param(
            300_000,
            {"RECEIPT_RESONATE_HEARTBEAT_INTERVAL_MS": "500000"},
            100_000,
            id="override raising is ignored",
        ),
        pytest.param(
            300_000,
            {"RECEIPT_RESONATE_HEARTBEAT_INTERVAL_MS": "100000"},
            100_000,
            id="override equal to the derived value",
        ),
        pytest.param(
            300_000,
            {"RECEIPT_RESONATE_HEARTBEAT_INTERVAL_MS": "100"},
            1_000,
            id="floor 1000 applies after the override",
        ),
        pytest.param(
            300_000,
            {"RECEIPT_RESONATE_HEARTBEAT_INTERVAL_MS": "0"},
            1_000,
            id="override 0 cannot make a busy loop",
        ),
    ],
)
def test_heartbeat_is_a_third_of_min_lease_active_stale(
    lease: int, env: dict[str, str], expected: int
) -> None:
    """Spec: "one third of the smaller of the lease and RECEIPT_RESONATE_ACTIVE_STALE_MS ...,
    floored at 1 000 ms" and "RECEIPT_RESONATE_HEARTBEAT_INTERVAL_MS can only lower that derived value,
    never raise it"."""
    assert heartbeat_interval_ms(lease, settings(env)) == expected


@pytest.mark.parametrize(
    ("lease", "expected"),
    [
        pytest.param(0, 120_000, id="floor 120000"),
        pytest.param(59_999, 120_000, id="lease 59999 -> floor 120000"),
        pytest.param(60_000, 120_000, id="lease 60000 -> exactly 120000"),
        pytest.param(60_001, 120_001, id="lease 60001 -> 120001"),
        pytest.param(300_000, 360_000, id="lease 300000 -> 360000 (lease plus 60000)"),
        pytest.param(3_600_000, 3_660_000, id="capped codex lease 3600000 -> 3660000"),
    ],
)
def test_driver_timeout_is_lease_plus_60000_floored_at_120000(lease: int, expected: int) -> None:
    """Spec: "The driver's own invocation timeout is the lease plus 60 000 ms, with a floor of 120 000 ms"."""
    assert driver_timeout_ms(lease) == expected


@pytest.mark.parametrize(
    ("agent_id", "kind", "payload", "env", "expected"),
    [
        pytest.param(
            "factory", "factory.run", {}, {}, JobTiming(300_000, 299_000, 100_000, 360_000), id="defaults"
        ),
        pytest.param(
            *OBJECTIVE_CONTROL,
            {},
            {"FACTORY_CONTROL_JOB_EXECUTION_TIMEOUT_MS": "120000"},
            JobTiming(900_000, 120_000, 200_000, 960_000),
            id="objective control with override",
        ),
        pytest.param(
            "codex",
            "factory.task.run",
            {"timeout": 3_400_000},
            {},
            JobTiming(3_600_000, 3_599_000, 200_000, 3_660_000),
            id="capped codex",
        ),
        pytest.param(
            "factory",
            "factory.run",
            {},
            {"JOB_LEASE_MS": "2000"},
            JobTiming(2_000, 5_000, 1_000, 120_000),
            id="every floor at once",
        ),
    ],
)
def test_timing_for_derives_everything_from_one_lease(
    agent_id: str, kind: str, payload: dict[str, Any], env: dict[str, str], expected: JobTiming
) -> None:
    """Spec: execution timeout, heartbeat cadence and driver timeout are all derived from the lease."""
    assert timing_for(agent_id, kind, payload, settings(env)) == expected


def test_spec_rule_constants_are_defined_once_with_the_spec_values() -> None:
    """Spec values that are rules, not configuration: 300000 pad, 3600000 cap, 1000, 5000, 1000,
    60000, 120000."""
    assert timing.CODEX_PAYLOAD_TIMEOUT_PAD_MS == 300_000
    assert timing.CODEX_LEASE_CAP_MS == 3_600_000
    assert timing.EXECUTION_TIMEOUT_MARGIN_MS == 1_000
    assert timing.EXECUTION_TIMEOUT_FLOOR_MS == 5_000
    assert timing.HEARTBEAT_DIVISOR == 3
    assert timing.HEARTBEAT_FLOOR_MS == 1_000
    assert timing.DRIVER_TIMEOUT_PAD_MS == 60_000
    assert timing.DRIVER_TIMEOUT_FLOOR_MS == 120_000


def test_config_defaults_match_the_spec_table() -> None:
    """Spec defaults: JOB_LEASE_MS 300 000, FACTORY_CONTROL/CODEX 900 000, ACTIVE_STALE 600 000."""
    s = settings()
    assert (s.job_lease_ms, s.factory_control_job_lease_ms, s.codex_job_lease_ms, s.active_stale_ms) == (
        300_000,
        900_000,
        900_000,
        600_000,
    )
    assert s.factory_control_job_execution_timeout_ms is None
    assert s.heartbeat_interval_ms is None


# -- retry backoff (RECEIPT_RETRY_BACKOFF_MS x 2^(attempt-1), capped by RECEIPT_RETRY_BACKOFF_MAX_MS) --


@pytest.mark.parametrize(
    ("env", "failed_attempt", "expected"),
    [
        ({}, 1, 1000),  # default base 1 000 ms
        ({}, 2, 2000),
        ({}, 3, 4000),
        ({}, 7, 60000),  # 64 000 capped at the default 60 000
        ({"RECEIPT_RETRY_BACKOFF_MS": "250"}, 3, 1000),
        ({"RECEIPT_RETRY_BACKOFF_MS": "0"}, 5, 0),  # 0 retries at once
        ({"RECEIPT_RETRY_BACKOFF_MAX_MS": "1500"}, 2, 1500),
        ({}, 0, 0),  # no attempt failed: no delay
        ({}, 1000, 60000),  # huge attempt numbers stay capped
    ],
)
def test_retry_delay_doubles_from_the_base_up_to_the_cap(
    env: dict[str, str], failed_attempt: int, expected: int
) -> None:
    from app.jobs.timing import retry_delay_ms

    assert retry_delay_ms(failed_attempt, Settings.from_env(env)) == expected
