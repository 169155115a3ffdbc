"""A worker process's runtime: what its attempts, passes and recovery loops act through.

Built lazily, once per process, from the Celery app it is attached to (wiring by construction: no
module-level engine or queue); nothing here imports Celery, the app is only where the runtime and
the slot counter are kept. Every message leaves through the delivery client over that app
(``delivery/client.py``); the queue's dispatch hook is its wake-up, so every job that becomes
queued (enqueue, retry, lease expiry) takes the one delivery path.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from app.composition import build_queue
from app.config import Settings
from app.storage.db import engine_for
from delivery.broker import probe_for
from delivery.callbacks import Callbacks
from delivery.client import DeliveryClient
from delivery.dispatcher import Dispatcher
from workers.registry import HandlerRegistry, default_registry
from workers.roles import concurrency, resolve_role
from workers.slots import Slots

# Set on the Celery app once its consumer fetches nothing while every slot is taken
# (``tasks/consumer.py``): only then does a process hand back attempts it has no slot for
# (``workers/attempts.py``), since another process, not this one, will fetch them.
FETCH_GATED = "receipt_fetch_gated"


@dataclass(kw_only=True)
class Runtime(Dispatcher):
    """A worker process's runtime: the dispatcher's parts and state, and what running an attempt
    needs beside them (the handlers, the process's slots)."""

    # The Celery app this runtime is attached to: it carries the slot counter and the consumer's
    # fetch gate (``slots_of``, ``FETCH_GATED``).
    app: Any
    registry: HandlerRegistry

    @property
    def slots(self) -> Slots:
        """The attempts this process may run at once, shared by every delivery it runs."""
        return slots_of(self.app, self.settings)

    @property
    def fetch_gated(self) -> bool:
        """Whether this process's consumer fetches nothing while every slot is taken (only then
        does a busy process hand back attempts it has no slot for: another process fetches them)."""
        return bool(getattr(self.app, FETCH_GATED, False))


_lock = threading.Lock()
T = TypeVar("T")


def _kept_on(app: Any, name: str, build: Callable[[], T]) -> T:
    """``app.<name>``, built once per process on first use (under one lock, checked twice)."""
    found: T | None = getattr(app, name, None)
    if found is not None:
        return found
    with _lock:
        found = getattr(app, name, None)
        if found is None:
            found = build()
            setattr(app, name, found)
    return found


def slots_of(app: Any, settings: Settings) -> Slots:
    """The process's one slot counter, kept on its Celery app: as many slots as the worker's pool
    has threads (``app.receipt_concurrency``, set when the worker starts), else the role's
    concurrency (``workers/roles.py``)."""

    def build() -> Slots:
        size = getattr(app, "receipt_concurrency", None) or concurrency(
            resolve_role(settings.process_role)[0], settings.execute_concurrency
        )
        return Slots(int(size))

    return _kept_on(app, "receipt_slots", build)


def get_runtime(app: Any) -> Runtime:
    def build() -> Runtime:
        settings: Settings = app.receipt_settings
        engine = engine_for(settings)
        client = DeliveryClient.through(app, settings)
        queue = build_queue(settings, engine=engine, on_dispatchable=client.wake, group_commit=True)
        registry = default_registry(settings.handler_modules.split(","))
        return Runtime(
            settings=settings,
            app=app,
            engine=engine,
            queue=queue,
            registry=registry,
            callbacks=Callbacks(settings),
            delivery=client,
            broker=probe_for(settings),
        )

    return _kept_on(app, "receipt_runtime", build)
