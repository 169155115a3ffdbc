"""Re-exported from ``devharness.otlp``, the harness's home (``bench/`` imports it there)."""

from __future__ import annotations

from devharness.otlp import OtlpReceiver, ReceivedSpan, decode

__all__ = ["OtlpReceiver", "ReceivedSpan", "decode"]
