"""What the system page reads from the broker: each queue's depth and who consumes it.

Depth comes from kombu's own queue declaration (``message_count``), which is a Redis ``LLEN``
over the priority lists on Redis and a file count on the embedded folder broker. Consumers come
from Celery's remote control (``inspect().active_queues()``), a broadcast the workers answer
within ``INSPECT_TIMEOUT_SECONDS``; on a transport without broadcast, or with no worker running,
the page says so instead of showing zero. Neither number is authoritative about jobs (receipts
are): they show whether delivery is keeping up.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from app.config import Settings
from app.jobs.routing import DRIVER_QUEUE, MAINTENANCE_QUEUE, QUEUES
from app.ops import preflight

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
    """Every queue Receipt uses and what runs on it (worker groups, the driver, maintenance)."""
    roles = {DRIVER_QUEUE: "driver"}
    roles.update({queue: f"worker group {group}" for group, queue in QUEUES.items()})
    roles[MAINTENANCE_QUEUE] = "recovery loops (scheduled by beat)"
    return roles


def consumers_by_queue(active_queues: Mapping[str, Any] | None) -> dict[str, list[str]]:
    """``inspect().active_queues()`` (worker → queue dicts) turned into queue → workers."""
    out: dict[str, list[str]] = {}
    for worker, queues in (active_queues or {}).items():
        for q in queues or []:
            name = q.get("name") if isinstance(q, Mapping) else None
            if isinstance(name, str):
                out.setdefault(name, []).append(str(worker))
    return {k: sorted(v) for k, v in out.items()}


class BrokerProbe:
    """Reads queue depths and consumers through a Celery app built from ``settings``."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._celery: Any = None
        self._cached: tuple[float, BrokerReport] | None = None

    def _app(self) -> Any:
        if self._celery is None:
            from tasks.celery_app import make_celery

            self._celery = make_celery(self.settings)
        return self._celery

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
            app = self._app()
        except Exception as exc:  # the tasks layer is not installed or not configurable here
            log.warning("system page: no Celery app", exc_info=True)
            return BrokerReport(transport, [], f"no Celery app ({type(exc).__name__})", 0, notes)
        depths: dict[str, int | None] = {}
        errors: dict[str, str] = {}
        try:
            with app.connection_for_read() as conn:
                channel = conn.default_channel
                for name in roles:
                    try:
                        depths[name] = int(channel.queue_declare(queue=name).message_count)
                    except Exception as exc:
                        depths[name] = None
                        errors[name] = type(exc).__name__
        except Exception as exc:
            for name in roles:
                depths[name], errors[name] = None, f"broker unreachable ({type(exc).__name__})"
        consumers_error = None
        answered = 0
        by_queue: dict[str, list[str]] = {}
        try:
            active = app.control.inspect(timeout=INSPECT_TIMEOUT_SECONDS).active_queues()
            answered = len(active or {})
            by_queue = consumers_by_queue(active)
        except Exception as exc:
            consumers_error = f"the workers could not be asked ({type(exc).__name__})"
        if consumers_error is None and answered == 0:
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
                depths.get(name),
                None if consumers_error else tuple(by_queue.get(name, ())),
                errors.get(name),
            )
            for name, role in roles.items()
        ]
        return BrokerReport(transport, stats, consumers_error, answered, notes)
