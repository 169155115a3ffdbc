"""Re-exported from ``devharness.up``, the harness's home (``bench/`` imports it there)."""

from __future__ import annotations

from devharness.up import (
    EXPORT_LINE,
    RECEIPT,
    SUPERVISED,
    Up,
    start_up,
)

__all__ = [
    "EXPORT_LINE",
    "RECEIPT",
    "SUPERVISED",
    "Up",
    "start_up",
]
