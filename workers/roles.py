"""Process roles: which queues a process consumes and how many jobs it runs at once.

Spec: five role names; anything else resolves to ``all``, which registers no worker group — it
consumes only maintenance work and parks — and is logged loudly, because a misspelled role is
otherwise silent and its jobs simply stay queued.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.jobs.routing import DRIVER_QUEUE, MAINTENANCE_QUEUE, OBJECTIVES_QUEUE, QUEUES

ROLE_NAMES = ("api", "driver", "worker-chat", "worker-codex", "worker-control")


@dataclass(frozen=True)
class Role:
    """A process role: its queues and default concurrency (threads)."""

    name: str
    queues: tuple[str, ...]
    default_concurrency: int


ROLES: dict[str, Role] = {
    "api": Role("api", (), 0),
    # The driver only reads, decides and sends: cheap, so more threads.
    "driver": Role("driver", (DRIVER_QUEUE, MAINTENANCE_QUEUE), 8),
    "worker-chat": Role("worker-chat", (QUEUES["chat"],), 8),
    # Codex jobs run subprocesses for up to an hour: few at a time per machine.
    "worker-codex": Role("worker-codex", (QUEUES["codex"],), 2),
    "worker-control": Role("worker-control", (QUEUES["control"], MAINTENANCE_QUEUE, OBJECTIVES_QUEUE), 4),
    "all": Role("all", (MAINTENANCE_QUEUE, OBJECTIVES_QUEUE), 1),
}


def resolve_role(raw: str | None) -> tuple[Role, bool]:
    """The role for a ``RECEIPT_PROCESS_ROLE`` value, and whether it was recognised."""
    name = (raw or "").strip()
    if name in ROLE_NAMES:
        return ROLES[name], True
    return ROLES["all"], name == "all"


def concurrency(role: Role, override: int | None) -> int:
    """``RECEIPT_RESONATE_EXECUTE_CONCURRENCY`` overrides every role's default."""
    if override is not None and override > 0:
        return override
    return max(1, role.default_concurrency)


def unknown_role_warning(raw: str | None) -> str:
    return (
        f"RECEIPT_PROCESS_ROLE={raw!r} is not a role; running as 'all' (maintenance only, no worker "
        f"group: jobs stay queued). Valid roles: {', '.join(ROLE_NAMES)}"
    )
