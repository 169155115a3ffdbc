"""The per-process runtime the Celery tasks act through: settings, engine, queue, handlers.

Built lazily, once per process, from the Celery app it is attached to (wiring by construction:
no module-level engine or queue). The queue's dispatch hook sends a wake-up to the scanner, so
every job that becomes queued (enqueue, retry, lease expiry) takes the one delivery path.
The delivery task names are defined in ``app/jobs/routing.py`` and re-exported here (``X as X``);
each recovery loop's task is declared with its loop (``app/ops/loops.py``).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from celery import Celery
from sqlalchemy.engine import Engine

from app.composition import build_queue
from app.config import Settings
from app.jobs.reducer import Job
from app.jobs.routing import DISPATCH_TASK as DISPATCH_TASK
from app.jobs.routing import DRIVER_QUEUE
from app.jobs.routing import DRIVER_TASK as DRIVER_TASK
from app.jobs.routing import EXECUTE_TASK as EXECUTE_TASK
from app.ops.wakes import WakeList, wake, wake_list_for
from app.storage.db import engine_for
from app.storage.queue import Queue
from tasks.broker import BrokerProbe, NullProbe, probe_for
from tasks.callbacks import Callbacks
from workers.registry import HandlerRegistry, default_registry


@dataclass
class Runtime:
    settings: Settings
    app: Celery
    engine: Engine
    queue: Queue
    registry: HandlerRegistry
    callbacks: Callbacks
    broker: BrokerProbe = field(default_factory=NullProbe)
    # The coalescing wake list (Redis brokers only): the scanner drains it (app/ops/wakes.py).
    wakes: WakeList | None = None


def send_wake(app: Celery, jobs: Sequence[Job], wakes: WakeList | None = None) -> None:
    """Ask the dispatch scanner to start drivers for these jobs: through the wake list, so one
    message wakes one scan for many jobs, or a small message of ids (no list)."""
    wake(
        lambda ids: app.send_task(DISPATCH_TASK, args=[ids], queue=DRIVER_QUEUE), wakes, [j.id for j in jobs]
    )


_lock = threading.Lock()


def get_runtime(app: Celery) -> Runtime:
    rt: Runtime | None = getattr(app, "receipt_runtime", None)
    if rt is not None:
        return rt
    with _lock:
        rt = getattr(app, "receipt_runtime", None)
        if rt is None:
            settings: Settings = app.receipt_settings
            engine = engine_for(settings)
            wakes = wake_list_for(settings.redis_url, app.conf.broker_transport_options)
            queue = build_queue(
                settings, engine=engine, on_dispatchable=lambda jobs: send_wake(app, jobs, wakes)
            )
            registry = default_registry(settings.handler_modules.split(","))
            rt = Runtime(
                settings, app, engine, queue, registry, Callbacks(settings), probe_for(settings), wakes
            )
            app.receipt_runtime = rt
    return rt
