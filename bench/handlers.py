"""A ``noop`` agent for the runtime benchmark: ``RECEIPT_HANDLER_MODULES=bench.handlers``.

It returns ``{}`` at once, so a benchmark measures the delivery path (enqueue -> dispatch ->
driver -> worker -> settle) and nothing else.
"""

from __future__ import annotations

from typing import Any

from workers.handler import JobContext
from workers.registry import HandlerRegistry

AGENT_ID = "noop"


def noop(ctx: JobContext) -> Any:
    return {}


def register(registry: HandlerRegistry) -> None:
    registry.register(AGENT_ID, noop)
