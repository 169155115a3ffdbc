"""A route's query schema is one object for the life of the process: the validators are compiled
and kept per schema object (``api.inputs``), so a schema built per request would compile, and keep,
one validator per request."""

from __future__ import annotations

from api import jobs, objectives


def test_a_scoped_route_has_one_query_schema_object() -> None:
    for view in (jobs.get_job, objectives.get_objective):
        op = view.openapi  # type: ignore[attr-defined]
        assert op.scoped
        assert op.effective_query() is op.effective_query()
        assert "organizationId" in op.effective_query()["properties"]
