"""The handler registry: agent id → handler. Exactly four agent ids are registered by default.

Deployments add their own handlers with ``RECEIPT_HANDLER_MODULES`` (comma-separated module
paths, each exposing ``register(registry)``), loaded by every worker process at start.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable

from app.jobs.vocab import HANDLED_AGENT_IDS
from workers.handler import Handler


class HandlerRegistry:
    """Maps agent ids to handlers."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def register(self, agent_id: str, handler: Handler) -> None:
        self._handlers[agent_id] = handler

    def get(self, agent_id: str) -> Handler | None:
        return self._handlers.get(agent_id)

    def agent_ids(self) -> tuple[str, ...]:
        return tuple(sorted(self._handlers))


def default_registry(extra_modules: Iterable[str] = ()) -> HandlerRegistry:
    """The four built-in handlers, plus those of any extra modules."""
    from workers.handlers import codex, factory

    registry = HandlerRegistry()
    registry.register("codex", codex.handle)
    registry.register("factory", factory.handle_factory)
    registry.register("factory-control", factory.handle_factory_control)
    registry.register("factory-monitor", factory.handle_factory_monitor)
    assert set(registry.agent_ids()) == set(HANDLED_AGENT_IDS)
    for name in extra_modules:
        name = name.strip()
        if name:
            importlib.import_module(name).register(registry)
    return registry
