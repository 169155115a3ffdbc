"""The planner interface of ``factory.run``, and the built-in planner.

A planner turns a written goal into a launch body (``title``, ``goal``, ``plan``, optional
``failurePolicy``/``objectiveId``) that ``plan.validate_objective`` then checks like any launch.
Deployments plug in their own with ``RECEIPT_PLANNER_MODULE``: a module exposing
``make_planner(settings) -> Planner``. The built-in planner plans nothing itself: it accepts a goal
that carries an explicit plan and refuses, non-retryably and saying so, one that does not.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any, Protocol

from app.config import Settings
from app.jobs.errors import ReceiptError


class PlannerRefused(ReceiptError):
    """The planner cannot plan this goal; retrying will not help."""


class Planner(Protocol):
    def plan(self, payload: Mapping[str, Any]) -> Mapping[str, Any]:
        """The launch body for a ``factory.run`` payload (raise ``PlannerRefused`` to refuse)."""
        ...


REFUSAL = (
    "the built-in planner only launches a goal that carries an explicit plan "
    '(payload.plan, or payload.goal as {"text": ..., "plan": {"tasks": [...]}}); '
    "to plan written goals, set RECEIPT_PLANNER_MODULE to a module with make_planner(settings)"
)


class ExplicitPlanPlanner:
    """Accepts ``payload.plan`` or ``payload.goal = {"text", "plan"}``; refuses a bare written goal."""

    def plan(self, payload: Mapping[str, Any]) -> Mapping[str, Any]:
        goal = payload.get("goal")
        plan = payload.get("plan")
        text = goal
        if isinstance(goal, Mapping):
            plan = goal.get("plan", plan)
            text = goal.get("text")
        if plan is None:
            raise PlannerRefused(REFUSAL)
        body: dict[str, Any] = {
            "title": payload.get("title") or (str(text)[:80] if text else "objective"),
            "goal": text if isinstance(text, str) and text.strip() else "(explicit plan)",
            "plan": plan,
        }
        for name in ("objectiveId", "failurePolicy"):
            if payload.get(name) is not None:
                body[name] = payload[name]
        return body


def make_planner(settings: Settings) -> Planner:
    return ExplicitPlanPlanner()


def load_planner(settings: Settings) -> Planner:
    """The configured planner (``RECEIPT_PLANNER_MODULE``)."""
    module = importlib.import_module(settings.planner_module.strip() or __name__)
    planner: Planner = module.make_planner(settings)
    return planner
