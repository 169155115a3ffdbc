"""Which worker group and Celery queue a job is delivered to, decided agent id first and kind second."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

from app.jobs.kinds import KINDS
from app.jobs.vocab import AGENT_CODEX, AGENT_FACTORY_CONTROL, WorkerGroup

# One Celery queue per worker group (the spec's Resonate groups receipt-chat/-codex/-control).
QUEUES: Final[Mapping[WorkerGroup, str]] = MappingProxyType(
    {
        "chat": "receipt-chat",
        "codex": "receipt-codex",
        "control": "receipt-control",
    }
)
# The driver RPC has its own group (spec: "Driver RPC"); the recovery loops' ticks go to beat's queues.
DRIVER_QUEUE: Final = "receipt-driver"
MAINTENANCE_QUEUE: Final = "receipt-maintenance"
# Spec ("Four independent recovery loops"): the objective-control outbox redrive runs on `worker-control`
# and `all` only, so it has its own beat queue that just those two roles consume.
OBJECTIVES_QUEUE: Final = "receipt-objectives"

# The delivery tasks' names, each spelled once: the worker registers them (tasks/celery_app.py) and
# the API publishes a wake-up by name (api/wake.py). Each recovery loop's task is declared with its
# loop (app/ops/loop_registry.py).
DISPATCH_TASK: Final = "receipt.dispatch"
DRIVER_TASK: Final = "receipt.driver"
EXECUTE_TASK: Final = "receipt.execute"
# Several attempts bound for one worker queue in one message (RECEIPT_DELIVERY_BATCH_MAX above 1).
EXECUTE_BATCH_TASK: Final = "receipt.execute_batch"

# Spec: `job.payload.kind startsWith "factory.integration."` -> receipt-codex. A declared kind says
# this itself (its ``route``; a test holds the two together); the prefix routes a kind no one
# declared, which the enqueue validator refuses, so only a job written by another path.
INTEGRATION_KIND_PREFIX: Final = "factory.integration."


@dataclass(frozen=True)
class Route:
    """Where a job is delivered, beside what its kind contract declares.

    Spec ("Payload kinds"): routing and the kind contract "do not always agree" and the spec says
    to treat that as an ambiguity, so the disagreement is carried as data (``agrees``) for callers
    to show or log, never resolved here.
    """

    worker_group: WorkerGroup
    queue: str
    # None when the kind has no contract (routing still works for it).
    contract_worker_group: WorkerGroup | None
    agrees: bool

    def to_json(self) -> dict[str, str | bool | None]:
        """The route in the API's camelCase field names."""
        return {
            "workerGroup": self.worker_group,
            "queue": self.queue,
            "contractWorkerGroup": self.contract_worker_group,
            "agreesWithContract": self.agrees,
        }


def worker_group_for(agent_id: str, kind: str) -> WorkerGroup:
    """The worker group that executes a job, exactly the spec's routing order."""
    # Spec ("Payload kinds"), evaluated top to bottom; the first match wins:
    #   agentId === "codex"                        -> receipt-codex
    #   kind startsWith "factory.integration."     -> receipt-codex   (the kind's own ``route``)
    #   agentId === "factory-control"              -> receipt-control
    #   otherwise                                  -> receipt-chat
    # Unknown agent ids fall through to chat, where the worker fails them with "No handler".
    if agent_id == AGENT_CODEX:
        return "codex"
    by_kind = kind_route(kind)
    if by_kind is not None:
        return by_kind
    if agent_id == AGENT_FACTORY_CONTROL:
        return "control"
    return "chat"


def kind_route(kind: str) -> WorkerGroup | None:
    """The group a kind itself routes to (after the agent id ``codex``), or None to leave it to the agent."""
    declared = KINDS.get(kind)
    if declared is not None:
        return declared.route
    return "codex" if kind.startswith(INTEGRATION_KIND_PREFIX) else None


def route(agent_id: str, kind: str) -> Route:
    """Route a job to its worker group and queue, and say whether that matches its kind contract."""
    group = worker_group_for(agent_id, kind)
    declared = KINDS.get(kind)
    contract_group = declared.contract.worker_group if declared is not None else None
    return Route(
        worker_group=group,
        queue=QUEUES[group],
        contract_worker_group=contract_group,
        # An unknown kind has nothing to agree with, so it never "agrees".
        agrees=contract_group == group,
    )


def queue_for(agent_id: str, kind: str) -> str:
    """The worker queue a job is delivered to (``route``'s queue, without its contract check)."""
    return QUEUES[worker_group_for(agent_id, kind)]
