"""What the system page reads from the broker: each queue's depth and who consumes it.

Both come through the web process's delivery client (``delivery/client.py``): depth from kombu's
queue declaration, consumers from a remote-control broadcast the workers answer within
``INSPECT_TIMEOUT_SECONDS``. On a transport without broadcast, or with no worker running, the page
says so instead of showing zero. Neither number is authoritative about jobs (receipts are): they
show whether delivery is keeping up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from app.config import Settings
from app.jobs.routing import DRIVER_QUEUE, MAINTENANCE_QUEUE, OBJECTIVES_QUEUE, QUEUES
from app.ops import preflight
from delivery.client import Consumers, DeliveryClient

log = logging.getLogger("receipt.ui")

INSPECT_TIMEOUT_SECONDS = 1.0
# The page is reloaded by people, not polled by machines; a few seconds of reuse spares the
# workers a broadcast per page view.
CACHE_SECONDS = 5.0


@dataclass(frozen=True)
class QueueStat:
    """One Celery queue: the worker group it serves, its depth, and the workers consuming it."""

    queue: str
    role: str
    depth: int | None
    consumers: tuple[str, ...] | None
    depth_error: str | None = None


@dataclass(frozen=True)
class BrokerReport:
    transport: str
    queues: list[QueueStat]
    # Why consumers are unknown (None when the broadcast worked, even with no worker answering).
    consumers_error: str | None = None
    workers_answered: int = 0
    notes: list[str] = field(default_factory=list)


def queue_roles() -> dict[str, str]:
    """Every queue Receipt uses and what runs on it (worker groups, the driver, the loops)."""
    roles = {DRIVER_QUEUE: "driver"}
    roles.update({queue: f"worker group {group}" for group, queue in QUEUES.items()})
    roles[MAINTENANCE_QUEUE] = "recovery loops (scheduled by beat)"
    roles[OBJECTIVES_QUEUE] = "objective outbox redrive and watchdog (scheduled by beat)"
    return roles


class QueueOverview:
    """The system page's view of the broker, read through a delivery client and kept a few seconds.

    ``client`` gives the client: the API's own (its wake-up publisher's), or one built on first use.
    """

    def __init__(self, settings: Settings, client: Callable[[], DeliveryClient] | None = None) -> None:
        self.settings = settings
        self._make = client if client is not None else lambda: DeliveryClient.publish_only(settings)
        self._client: DeliveryClient | None = None
        self._cached: tuple[float, BrokerReport] | None = None

    def client(self) -> DeliveryClient:
        if self._client is None:
            self._client = self._make()
        return self._client

    def report(self) -> BrokerReport:
        now = time.monotonic()
        if self._cached is not None and now - self._cached[0] < CACHE_SECONDS:
            return self._cached[1]
        report = self._read()
        self._cached = (now, report)
        return report

    def _read(self) -> BrokerReport:
        transport = "redis" if self.settings.redis_url else "embedded folder broker"
        notes: list[str] = []
        roles = queue_roles()
        if self.settings.redis_url:
            # One PING first: a Redis that is down answers "refused" at once, where kombu's connect
            # and Celery's broadcast would each retry for seconds while the page waits.
            problem = preflight.broker_problem(self.settings, timeout_s=INSPECT_TIMEOUT_SECONDS)
            if problem is not None:
                down = [
                    QueueStat(name, role, None, None, f"broker unreachable ({problem.what})")
                    for name, role in roles.items()
                ]
                return BrokerReport(
                    transport,
                    down,
                    "the workers could not be asked (the broker is unreachable)",
                    0,
                    [problem.line()],
                )
        try:
            client = self.client()
        except Exception as exc:  # Celery or its configuration cannot be loaded here
            log.warning("system page: no delivery client", exc_info=True)
            return BrokerReport(transport, [], f"no Celery app ({type(exc).__name__})", 0, notes)
        depths = client.queue_depths(roles)
        consumers_error = None
        consumers = Consumers({}, 0)
        try:
            consumers = client.consumers(INSPECT_TIMEOUT_SECONDS)
        except Exception as exc:
            consumers_error = f"the workers could not be asked ({type(exc).__name__})"
        if consumers_error is None and consumers.answered == 0:
            notes.append(
                f"No worker answered within {INSPECT_TIMEOUT_SECONDS:g} s: none runs, or all are busy."
            )
        if not self.settings.redis_url:
            notes.append(
                "Embedded folder broker: depth is the number of message files waiting; "
                "messages a worker has fetched are no longer counted."
            )
        stats = [
            QueueStat(
                name,
                role,
                depths[name].messages,
                None if consumers_error else tuple(consumers.by_queue.get(name, ())),
                depths[name].error,
            )
            for name, role in roles.items()
        ]
        return BrokerReport(transport, stats, consumers_error, consumers.answered, notes)
