"""Re-exported from ``devharness.waiting``, the harness's home (``bench/`` imports it there)."""

from __future__ import annotations

from devharness.waiting import (
    free_port,
    port_open,
    wait_for,
)

__all__ = [
    "free_port",
    "port_open",
    "wait_for",
]
