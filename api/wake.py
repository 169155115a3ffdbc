"""The API's wake-up publisher: after an enqueue commits, one small message to the dispatch scanner.

Publish-only: a Celery producer configured from the shared configuration
(``celeryconfig``) sends the dispatch task *by name*; the API imports no worker code
(``tasks``, ``workers``), so a web process never loads handlers or task modules to send one
message. ``app/`` never imports Celery: the queue calls ``on_dispatchable(jobs)`` after commit.

Nothing here falls back quietly. A publisher that cannot be built — a missing or broken import,
a transport that cannot load — stops start-up with an error, and ``/readyz`` reports the same
check as ``wake``. (Were it quiet, every job would wait for the queued redrive, up to 30 s.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from app.config import Settings
from app.jobs.reducer import Job
from app.jobs.routing import DISPATCH_TASK, DRIVER_QUEUE
from app.ops.wakes import wake, wake_list_for

log = logging.getLogger("receipt.api")

Waker = Callable[[Sequence[Job]], None]
OK = "ok"


class WakeUnavailable(RuntimeError):
    """The wake-up publisher cannot be built or cannot load its transport."""


class WakePublisher:
    """Wakes the dispatch scanner for newly dispatchable jobs: their ids go onto the coalescing
    wake list and ``receipt.dispatch`` is sent when no scan is armed (``app/ops/wakes.py``), or,
    without Redis, the message carries the ids."""

    def __init__(self, settings: Settings) -> None:
        try:
            from celery import Celery

            import celeryconfig
        except ImportError as exc:
            raise WakeUnavailable(f"the wake-up publisher cannot be imported: {exc}") from exc
        self.celery: Any = Celery("receipt-api", set_as_current=False)
        self.celery.config_from_object(celeryconfig.build(settings))
        self.wakes = wake_list_for(settings.redis_url, self.celery.conf.broker_transport_options)

    def __call__(self, jobs: Sequence[Job]) -> None:
        wake(self._send, self.wakes, [j.id for j in jobs])

    def _send(self, ids: list[str]) -> None:
        self.celery.send_task(DISPATCH_TASK, args=[ids], queue=DRIVER_QUEUE)

    def check(self) -> str:
        """``ok``, or why a wake-up could not be published (no network I/O: the broker has its own check).

        Loads the broker transport (kombu imports it on first use, e.g. the redis client library)
        and confirms the driver queue is declared.
        """
        try:
            with self.celery.connection_for_write() as conn:
                conn.transport  # noqa: B018 - loading the transport class is the check
            if DRIVER_QUEUE not in self.celery.amqp.queues:
                return f"queue {DRIVER_QUEUE} is not configured"
        except Exception as exc:
            return f"unavailable ({type(exc).__name__}: {exc})"
        return OK


def default_waker(settings: Settings) -> WakePublisher:
    """The production waker, checked once: a broken publisher fails start-up, never silently."""
    publisher = WakePublisher(settings)
    problem = publisher.check()
    if problem != OK:
        raise WakeUnavailable(f"the wake-up publisher is not usable: {problem}")
    return publisher


def check_waker(waker: Waker | None) -> str:
    """The ``wake`` readiness check: the publisher's own check, or ``ok`` for an injected callable."""
    if waker is None:
        return "no wake-up publisher"
    check: Callable[[], str] | None = getattr(waker, "check", None)
    return check() if check is not None else OK
