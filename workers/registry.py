"""The handler registry: agent id → handler. Exactly four agent ids are registered by default.

Each built-in agent's handler is ``dispatch``: it looks the job's kind up in the kinds table
(``app.jobs.kinds``) and runs the function bound to it (``workers.kinds.handles``); a kind declared
for another agent is refused non-retryably. Deployments add their own handlers with
``RECEIPT_HANDLER_MODULES`` (comma-separated module paths, each exposing ``register(registry)``),
loaded by every worker process at start.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Iterable
from typing import Any

from app.jobs.errors import wrong_agent_message
from app.jobs.kinds import HANDLED_AGENT_IDS, KINDS
from workers.handler import Handler, HandlerError, JobContext
from workers.kinds import HANDLERS, unbound

# The modules that bind the built-in kinds' handlers (``@handles``).
HANDLER_MODULES = ("workers.handlers.factory", "workers.handlers.codex", "workers.handlers.integration")


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


@functools.cache
def load_handlers() -> None:
    """Import the built-in handler modules (once); refuse when a declared kind has no handler."""
    for name in HANDLER_MODULES:
        importlib.import_module(name)
    missing = unbound()
    if missing:
        raise RuntimeError(f"payload kinds without a handler (bind one with @handles): {', '.join(missing)}")


def dispatch(ctx: JobContext) -> Any:
    """Run the job's kind's handler, when the kind is declared for the job's agent."""
    load_handlers()
    declared = KINDS.get(ctx.job.kind)
    if declared is None or declared.agent != ctx.job.agent_id:
        raise HandlerError(wrong_agent_message(ctx.job.agent_id, ctx.job.kind), retryable=False)
    return HANDLERS[declared.name](ctx)


def default_registry(extra_modules: Iterable[str] = ()) -> HandlerRegistry:
    """The four built-in agents (each dispatching through the kinds table), plus any extra modules'."""
    load_handlers()
    registry = HandlerRegistry()
    for agent_id in HANDLED_AGENT_IDS:
        registry.register(agent_id, dispatch)
    for name in extra_modules:
        name = name.strip()
        if name:
            importlib.import_module(name).register(registry)
    return registry
