"""The three ``factory*`` handlers, until the Factory layer gives them their real behaviour.

They do the minimum their kinds need and never pretend success: a kind whose work belongs to
the Factory layer (objectives, task graphs) fails non-retryably with a message saying so.
The watchdog is the exception: with no objective ledger yet there is nothing to reconcile, and
reporting a scan of zero objectives is the truth.
"""

from __future__ import annotations

from typing import Any

from workers.handler import HandlerError, JobContext


def _not_available(ctx: JobContext, agent: str) -> HandlerError:
    return HandlerError(
        f"agent '{agent}' cannot run kind '{ctx.job.kind}' yet: the Factory layer is not installed",
        retryable=False,
    )


def handle_factory(ctx: JobContext) -> Any:
    raise _not_available(ctx, "factory")


def handle_factory_control(ctx: JobContext) -> Any:
    if ctx.job.kind == "factory.objective.watchdog":
        return {"objectivesScanned": 0, "reconciled": [], "note": "no objective ledger installed"}
    raise _not_available(ctx, "factory-control")


def handle_factory_monitor(ctx: JobContext) -> Any:
    raise _not_available(ctx, "factory-monitor")
