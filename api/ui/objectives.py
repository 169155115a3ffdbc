"""The one seam between the dashboard and Factory objectives: a small reader, found at run time.

The pages (``objective_views``) only ever call an ``ObjectiveReader``. ``find_reader`` builds one
from ``app.factory`` when that package is installed, and otherwise returns ``Unavailable`` with
the sentence the pages show. Wiring the dashboard to the Factory store is done here and only
here: ``_wire`` must return a reader, or ``Unavailable`` saying why not (never a stub that
pretends there are no objectives).

The reader speaks the JSON of ``GET /objectives/<id>``: ``{id, title, goal, status, phase,
failurePolicy, tasks: [{id, agentId, kind, dependsOn, status, jobId, attempt, result, error}],
audit, createdAt, updatedAt}``; scoping is the reader's job, with the caller's ``Scope`` (an
objective of another organisation is ``None``, exactly like an unknown one).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Protocol

from sqlalchemy.engine import Engine

from app.storage.overview import Scope

FACTORY_MODULE = "app.factory"
NOT_AVAILABLE = "Factory objectives are not available on this server."
OBJECTIVE_STREAM_PREFIX = "objectives/"


@dataclass(frozen=True)
class ObjectivePage:
    objectives: list[Mapping[str, Any]]
    next_cursor: str | None


class ObjectiveReader(Protocol):
    """What the objective pages need from the Factory."""

    def list(self, scope: Scope, *, status: str | None, limit: int, cursor: str | None) -> ObjectivePage:
        """A page of objectives, newest first, visible under ``scope``."""
        ...

    def get(self, scope: Scope, objective_id: str) -> Mapping[str, Any] | None:
        """One objective in the API's JSON shape, or None when unknown or not visible."""
        ...


@dataclass(frozen=True)
class Unavailable:
    """No reader: the sentence the pages show instead of objectives."""

    reason: str


Importer = Callable[[str], ModuleType]


def find_reader(
    engine: Engine, importer: Importer = importlib.import_module
) -> ObjectiveReader | Unavailable:
    """The Factory's reader on this server, or why there is none."""
    try:
        factory = importer(FACTORY_MODULE)
    except ModuleNotFoundError as exc:
        if exc.name is not None and FACTORY_MODULE.startswith(exc.name):
            return Unavailable(NOT_AVAILABLE)
        raise  # the Factory is installed but broken: that must not pass for "not installed"
    return _wire(factory, engine)


def _wire(factory: ModuleType, engine: Engine) -> ObjectiveReader | Unavailable:
    """Adapt ``app.factory`` to ``ObjectiveReader``.

    Looks for ``dashboard_reader(engine) -> ObjectiveReader`` on the package. When the Factory
    offers its reads under other names, adapt them here (and nowhere else).
    """
    make = getattr(factory, "dashboard_reader", None)
    if make is None:
        return Unavailable(
            "Factory objectives exist on this server, but the dashboard is not wired to them "
            "(api/ui/objectives.py: app.factory has no dashboard_reader)."
        )
    reader: ObjectiveReader = make(engine)
    return reader


def stream_of(objective_id: str) -> str:
    """The objective's receipt stream (issue 9: ``objectives/<objectiveId>``)."""
    return OBJECTIVE_STREAM_PREFIX + objective_id
