"""The handler column of the kinds table: one function per payload kind, bound with ``@handles``.

The kinds are declared in ``app.jobs.kinds`` (pure: the job domain imports no worker code), and
the worker side binds each one's handler beside its code::

    @handles(kinds.CONTROL)
    def control(ctx: JobContext) -> Any: ...

``workers.registry`` imports the built-in handler modules and refuses to build a registry while a
declared kind has no handler (``unbound``), so a kind declared without its code fails when a worker
starts, not when its first job arrives.
"""

from __future__ import annotations

from collections.abc import Callable

from app.jobs.kinds import KINDS, Kind
from workers.handler import Handler

# Payload kind name -> its handler.
HANDLERS: dict[str, Handler] = {}


def handles(*declared: Kind) -> Callable[[Handler], Handler]:
    """Bind the decorated function as the handler of each of ``declared``."""

    def bind(handler: Handler) -> Handler:
        for kind in declared:
            if KINDS.get(kind.name) is not kind:
                raise ValueError(f"{kind.name!r} is not a kind of app.jobs.kinds.KINDS")
            if kind.name in HANDLERS:
                raise ValueError(f"payload kind {kind.name!r} already has a handler")
            HANDLERS[kind.name] = handler
        return handler

    return bind


def unbound() -> list[str]:
    """Declared kinds without a handler (``workers.registry`` refuses to build a registry with one)."""
    return [name for name in KINDS if name not in HANDLERS]
