"""The API's thin hook into delivery: after an enqueue commits, wake the dispatch scanner."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from app.config import Settings
from app.jobs.reducer import Job
from tasks.celery_app import make_celery
from tasks.runtime import send_wake


def build_waker(settings: Settings) -> Callable[[Sequence[Job]], None]:
    """A function that sends one wake-up message for the given newly dispatchable jobs."""
    app = make_celery(settings)
    return lambda jobs: send_wake(app, jobs)
