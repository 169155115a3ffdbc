"""``schemathesis run --checks all`` against a live web process, on a bounded budget.

The in-process fuzz test (tests/integration/api/test_fuzz.py) runs the same checks through the
Python API; this runs the command line exactly as a user would — including its coverage phase,
which generates boundary values from every pattern and length in the document — against real
gunicorn on PostgreSQL. Workers are not needed: the fuzzer only talks to the API.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from app.ops import loop_registry
from tests.support.processes import PYTHON
from tests.support.stack import Stack

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e")]

# Per operation and phase; RECEIPT_TEST_CLI_FUZZ_EXAMPLES raises it for a deeper local run.
MAX_EXAMPLES = os.environ.get("RECEIPT_TEST_CLI_FUZZ_EXAMPLES", "10")
TIMEOUT_S = 900
# Operations whose bodies carry a plan: JSON Schema states a plan's shape, not its graph rules
# (cycles, unknown dependencies, each task's job validation), which their descriptions state.
GRAPH_RULED = ("objectives_launch", "objectives_replan")
# And schedules': a cron croniter runs, an IANA zone that exists, a backfill range in the past.
TEXT_RULED = ("schedules_create", "schedules_update", "schedules_backfill")


def test_schemathesis_run_with_every_check_passes(stack: Stack, tmp_path: Path) -> None:
    # Event streams of jobs that never settle (no workers) end after a second, not five minutes.
    stack.env_overrides["RECEIPT_SSE_MAX_SECONDS"] = "1"
    # No worker runs, so no recovery loop does: long intervals keep /readyz from (rightly)
    # answering 503 "loops overdue" while the fuzzer runs.
    for declared in loop_registry.interval_settings():
        stack.env_overrides[declared.env] = "600000"
    stack.env_overrides["RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_ENABLED"] = "0"
    stack.start("web")

    def schemathesis_run(*selection: str) -> str:
        result = subprocess.run(
            [
                PYTHON,
                "-m",
                "schemathesis.cli",
                "run",
                stack.url("/openapi.json"),
                "--checks",
                "all",
                *selection,
                "-H",
                f"Authorization: Bearer {stack.system_token}",
                "--max-examples",
                MAX_EXAMPLES,
                "--seed",
                "1",
                "--no-color",
            ],
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            env=dict(os.environ),
            cwd=tmp_path,  # its crash cache (.schemathesis/) stays out of the checkout
        )
        summary = result.stdout[result.stdout.find("SUMMARY") :]
        assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
        assert "Selected: " in summary and "Tested: " in summary
        return summary

    # Every operation but the rule-carrying ones (plans, schedules), with every check and every phase.
    ruled = (*GRAPH_RULED, *TEXT_RULED)
    summary = schemathesis_run(*[a for op in ruled for a in ("--exclude-operation-id", op)])
    for phase in ("Coverage", "Fuzzing", "Stateful"):
        assert f"✅ {phase}" in summary, summary
    print(summary)
    # The rule-carrying ones: every check but positive-data acceptance (a schema-valid plan may
    # still break a graph rule, a schema-valid cron be one croniter refuses: its 400 is the answer).
    summary = schemathesis_run(
        *[a for op in ruled for a in ("--include-operation-id", op)],
        "--exclude-checks",
        "positive_data_acceptance",
    )
    for phase in ("Coverage", "Fuzzing"):
        assert f"✅ {phase}" in summary, summary
    print(summary)
