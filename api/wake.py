"""The API's wake-up: after an enqueue commits, the delivery client wakes the dispatch scanner.

The publishing is ``delivery.client.DeliveryClient`` (the one wake sender, shared with the workers);
this module is what the web process adds: the client built once at start-up and checked, loudly.
``app/`` never imports Celery: the queue calls ``on_dispatchable(jobs)`` after commit.

Nothing here falls back quietly. A publisher that cannot be built — a missing or broken import,
a transport that cannot load — stops start-up with an error, and ``/readyz`` reports the same
check as ``wake``. (Were it quiet, every job would wait for the queued redrive, up to 30 s.)
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from app.config import Settings
from app.jobs.reducer import Job
from delivery.client import OK, DeliveryClient, DeliveryUnavailable

log = logging.getLogger("receipt.api")

Waker = Callable[[Sequence[Job]], None]


class WakeUnavailable(RuntimeError):
    """The wake-up publisher cannot be built or cannot load its transport."""


class WakePublisher:
    """Wakes the dispatch scanner for newly dispatchable jobs, through the web process's delivery
    client (which the dashboard's system page reads the broker with, too)."""

    def __init__(self, settings: Settings) -> None:
        try:
            self.delivery = DeliveryClient.publish_only(settings)
        except DeliveryUnavailable as exc:
            raise WakeUnavailable(f"the wake-up publisher cannot be imported: {exc}") from exc

    def __call__(self, jobs: Sequence[Job]) -> None:
        self.delivery.wake(jobs)

    def check(self) -> str:
        """``ok``, or why a wake-up could not be published (``DeliveryClient.check``)."""
        return self.delivery.check()


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
