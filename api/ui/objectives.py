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
    return _wire(factory, engine, importer)


def _wire(factory: ModuleType, engine: Engine, importer: Importer) -> ObjectiveReader | Unavailable:
    """Adapt ``app.factory`` to ``ObjectiveReader``.

    A package offering ``dashboard_reader(engine)`` is used as is. Otherwise the Factory's own
    reads are adapted (``service.get``, ``storage.list_page``, and the API's ``live_json``, so the
    dashboard shows exactly what ``GET /objectives/<id>`` shows). Anything else is reported, not
    papered over.
    """
    make = getattr(factory, "dashboard_reader", None)
    if make is not None:
        reader: ObjectiveReader = make(engine)
        return reader
    try:
        service = importer(f"{FACTORY_MODULE}.service")
        storage = importer(f"{FACTORY_MODULE}.storage")
        presenter = importer("api.objectives")
    except ModuleNotFoundError as exc:
        return Unavailable(
            "Factory objectives exist on this server, but the dashboard is not wired to them "
            f"(api/ui/objectives.py: {exc.name} is missing)."
        )
    needed = {
        "service.get": service,
        "service.find": service,
        "storage.list_page": storage,
        "api.objectives.live_json": presenter,
    }
    missing = [name for name, module in needed.items() if not hasattr(module, name.rsplit(".", 1)[1])]
    if missing:
        return Unavailable(
            "Factory objectives exist on this server, but the dashboard is not wired to them "
            f"(api/ui/objectives.py: no {', '.join(missing)})."
        )
    return FactoryReader(engine, service, storage, presenter)


class FactoryReader:
    """The Factory's reads behind ``ObjectiveReader``, scoped like ``GET /objectives``."""

    def __init__(self, engine: Engine, service: Any, storage: Any, presenter: Any) -> None:
        self.engine = engine
        self.service = service
        self.storage = storage
        self.presenter = presenter

    def _visible(self, scope: Scope, objective_id: str) -> Any:
        """The objective the scope's organisation knows as ``objective_id`` (another organisation's
        of the same id is the same "not found" as none)."""
        return self.service.find(self.engine, scope.organization_id, objective_id)

    def _header(self, scope: Scope, key: str) -> Any:
        obj = self.service.get(self.engine, key)
        if obj is None:
            return None
        if not scope.all_organizations and obj.organization_id != scope.organization_id:
            return None
        return obj

    def list(self, scope: Scope, *, status: str | None, limit: int, cursor: str | None) -> ObjectivePage:
        with self.engine.connect() as conn:
            page = self.storage.list_page(
                conn,
                organization_id=scope.organization_id,
                all_organizations=scope.all_organizations,
                status=status,
                limit=limit,
                cursor=cursor,
            )
        found = [self._header(scope, header.id) for header in page.objectives]
        return ObjectivePage([self.presenter.live_json(o) for o in found if o is not None], page.next_cursor)

    def get(self, scope: Scope, objective_id: str) -> Mapping[str, Any] | None:
        obj = self._visible(scope, objective_id)
        if obj is None:
            return None
        shown: Mapping[str, Any] = self.presenter.live_json(obj)
        return shown
