"""The composition root: the one place a ``Queue`` is built from the settings.

The API, the Celery workers and the web process's resume at startup each build their queue here,
so every process obeys every queue setting (the command cap, the callback targets) alike, and the
observers every long-lived process runs (metrics, the background ledger writer) are attached once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sqlalchemy.engine import Engine

from app.config import Settings
from app.jobs.reducer import Job
from app.ops import metrics
from app.storage.db import engine_for
from app.storage.queue import Queue


def build_queue(
    settings: Settings,
    *,
    engine: Engine | None = None,
    on_dispatchable: Callable[[Sequence[Job]], None] | None = None,
) -> Queue:
    """The queue of a long-lived process: its settings, metrics, and ledger rows written in the
    background. ``on_dispatchable`` is how this process wakes the dispatch scanner after a commit."""
    return Queue(
        engine if engine is not None else engine_for(settings),
        on_dispatchable=on_dispatchable,
        max_commands_per_job=settings.max_commands_per_job,
        on_applied=metrics.observe,
        callback_targets=settings.callback_targets,
        ledger_in_background=True,
    )
