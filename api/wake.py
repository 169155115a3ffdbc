"""The thin hook by which an enqueue wakes the dispatch scanner (``tasks.wake``), if installed.

``app/`` never imports Celery: the queue calls ``on_dispatchable(jobs)`` after commit, and the
API passes it the waker that ``tasks.wake.build_waker`` makes. Without ``tasks`` (or without
that module yet) there is no waker and the queued-job redrive delivers the jobs instead.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from app.config import Settings
from app.jobs.reducer import Job

log = logging.getLogger("receipt.api")

Waker = Callable[[Sequence[Job]], None]


def default_waker(settings: Settings) -> Waker | None:
    """``tasks.wake.build_waker(settings)``, or None when the tasks layer is not importable."""
    try:
        from tasks.wake import build_waker
    except ImportError:
        log.info("tasks.wake is not available: enqueues will be delivered by the queued redrive")
        return None
    waker: Waker = build_waker(settings)
    return waker
