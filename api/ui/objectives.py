"""The one seam between the dashboard and Factory objectives: a small reader.

The pages (``objective_views``) only ever call an ``ObjectiveReader``; ``FactoryReader`` is the
Factory's, and tests put their own behind the seam (``objective_views.FINDER_EXTENSION``).

The reader speaks the JSON of ``GET /objectives/<id>`` (``api.objectives.live_json``), so the
dashboard shows exactly what the API shows; scoping is the reader's job, with the caller's
``Scope`` (an objective of another organisation is ``None``, exactly like an unknown one).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from sqlalchemy.engine import Engine

from api.objectives import live_json
from app.factory import service, storage
from app.factory.reducer import Objective
from app.storage.overview import Scope


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


class FactoryReader:
    """The Factory's reads behind ``ObjectiveReader``, scoped like ``GET /objectives``."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def _header(self, scope: Scope, key: str) -> Objective | None:
        obj = service.get(self.engine, key)
        if obj is None:
            return None
        if not scope.all_organizations and obj.organization_id != scope.organization_id:
            return None
        return obj

    def list(self, scope: Scope, *, status: str | None, limit: int, cursor: str | None) -> ObjectivePage:
        with self.engine.connect() as conn:
            page = storage.list_page(
                conn,
                organization_id=scope.organization_id,
                all_organizations=scope.all_organizations,
                status=status,
                limit=limit,
                cursor=cursor,
            )
        found = [self._header(scope, header.id) for header in page.objectives]
        return ObjectivePage([live_json(o) for o in found if o is not None], page.next_cursor)

    def get(self, scope: Scope, objective_id: str) -> Mapping[str, Any] | None:
        """The objective the scope's organisation knows as ``objective_id`` (another organisation's
        of the same id is the same "not found" as none)."""
        obj = service.find(self.engine, scope.organization_id, objective_id)
        return None if obj is None else live_json(obj)
