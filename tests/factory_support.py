"""Test support for the Factory: in-process handlers and a synchronous driver of objectives.

``drain`` runs every queued job (task jobs, control jobs, audit jobs) through the real worker path
(``workers.runner.run_attempt`` with the real registry plus the test handlers below) until nothing is
queued — the same receipts a deployment writes, without Celery.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from app.config import Settings
from app.storage.db import jobs
from app.storage.queue import Queue
from devharness import handlers
from workers.registry import HandlerRegistry, default_registry
from workers.runner import run_attempt

ECHO = "test-echo"
FAIL = "test-fail"
HOLD = "test-hold"


def register(registry: HandlerRegistry) -> None:
    # The harness's task handlers under the agent ids these tests' plans name.
    registry.register(ECHO, handlers.task)
    registry.register(FAIL, handlers.failing_task)


def registry() -> HandlerRegistry:
    reg = default_registry()
    register(reg)
    return reg


def queued_ids(queue: Queue, *, skip_agents: tuple[str, ...] = ()) -> list[str]:
    with queue.engine.connect() as conn:
        rows = conn.execute(
            select(jobs.c.id, jobs.c.agent_id).where(jobs.c.status == "queued").order_by(jobs.c.created_at)
        ).all()
    return [r.id for r in rows if r.agent_id not in skip_agents]


def drain(queue: Queue, *, skip_agents: tuple[str, ...] = (), rounds: int = 500) -> int:
    """Run queued jobs until none is left (except those of ``skip_agents``); returns how many ran."""
    settings = Settings(retry_backoff_ms=0)
    reg = registry()
    ran = 0
    for _ in range(rounds):
        ids = queued_ids(queue, skip_agents=skip_agents)
        if not ids:
            return ran
        for job_id in ids:
            job = queue.get(job_id)
            if job is None or job.status != "queued":
                continue
            run_attempt(queue, settings, reg, job_id, job.attempt + 1)
            ran += 1
    raise AssertionError("jobs kept being queued")


def plan(deps: dict[str, list[str]], agents: dict[str, str] | None = None) -> dict[str, Any]:
    agents = agents or {}
    return {
        "tasks": [
            {"id": t, "agentId": agents.get(t, ECHO), "payload": {"kind": "factory.task.run"}, "dependsOn": d}
            for t, d in deps.items()
        ]
    }


DIAMOND = {"A": [], "B": ["A"], "C": ["A"], "D": ["B", "C"]}
