"""Re-exported from ``devharness.processes``, the harness's home (``bench/`` imports it there)."""

from __future__ import annotations

from devharness.processes import (
    ACTIVE,
    ISOLATED_NAMES,
    ISOLATED_PREFIXES,
    PYTHON,
    REPO_ROOT,
    STOP_GRACE_S,
    TEST_PREFIX,
    Harness,
    Proc,
    active_log_tails,
    active_notable_lines,
    base_env,
    children_of,
    descendants_of,
    harness_at,
    is_isolated,
    pid_alive,
    wait_started,
)

__all__ = [
    "ACTIVE",
    "ISOLATED_NAMES",
    "ISOLATED_PREFIXES",
    "PYTHON",
    "REPO_ROOT",
    "STOP_GRACE_S",
    "TEST_PREFIX",
    "Harness",
    "Proc",
    "active_log_tails",
    "active_notable_lines",
    "base_env",
    "children_of",
    "descendants_of",
    "harness_at",
    "is_isolated",
    "pid_alive",
    "wait_started",
]
