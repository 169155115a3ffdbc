"""The per-process runtime the Celery tasks act through: settings, engine, queue, handlers.

Built lazily, once per process, from the Celery app it is attached to (wiring by construction:
no module-level engine or queue). Every message leaves through the delivery client over that app
(``delivery/client.py``); the queue's dispatch hook is its wake-up, so every job that becomes
queued (enqueue, retry, lease expiry) takes the one delivery path.
The delivery task names are defined in ``app/jobs/routing.py`` and re-exported here (``X as X``);
each recovery loop's task is declared with its loop (``app/ops/loop_registry.py``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from celery import Celery
from sqlalchemy.engine import Engine

from app.composition import build_queue
from app.config import Settings
from app.dispatch.fast import Rooms
from app.dispatch.gate import PassGate
from app.dispatch.line import PassResult
from app.jobs.routing import DISPATCH_TASK as DISPATCH_TASK
from app.jobs.routing import DRIVER_TASK as DRIVER_TASK
from app.jobs.routing import EXECUTE_BATCH_TASK as EXECUTE_BATCH_TASK
from app.jobs.routing import EXECUTE_TASK as EXECUTE_TASK
from app.storage.db import engine_for
from app.storage.queue import Queue
from delivery.broker import BrokerProbe, NullProbe, probe_for
from delivery.client import DeliveryClient
from delivery.wakes import WakeList
from tasks.callbacks import Callbacks
from workers.registry import HandlerRegistry, default_registry
from workers.roles import concurrency, resolve_role
from workers.slots import Slots

if TYPE_CHECKING:
    from tasks.execute import LocalRuns


@dataclass
class Runtime:
    settings: Settings
    app: Celery
    engine: Engine
    queue: Queue
    registry: HandlerRegistry
    callbacks: Callbacks
    # Sends through ``app`` (the driver's and worker messages, wake-ups).
    delivery: DeliveryClient
    broker: BrokerProbe = field(default_factory=NullProbe)
    # Each worker queue's latest dispatch pass in this process, and when it ran (monotonic): the
    # wake listener runs a queue's pass again when its line may move without a wake-up.
    passes: dict[str, tuple[float, PassResult]] = field(default_factory=dict)
    # One pass per queue at a time in this process; asks meanwhile fold into one more pass.
    gate: PassGate = field(default_factory=PassGate)
    # What this process claimed directly per queue since its last pass there (``app.dispatch.fast``).
    rooms: Rooms = field(default_factory=Rooms)
    # Full lines that jobs joined without a pass, and when this process looks at each (monotonic).
    looks: dict[str, float] = field(default_factory=dict)
    # A worker process's runs of what its own passes claimed for its free slots (``RECEIPT_DELIVERY_LOCAL``).
    local: LocalRuns | None = None

    @property
    def slots(self) -> Slots:
        """The attempts this process may run at once, shared by every delivery it runs."""
        return slots_of(self.app, self.settings)

    @property
    def wakes(self) -> WakeList | None:
        """The coalescing wake list (Redis brokers only): the scanner drains it (delivery/wakes.py)."""
        return self.delivery.wakes


_lock = threading.Lock()


def slots_of(app: Any, settings: Settings) -> Slots:
    """The process's one slot counter, kept on its Celery app: as many slots as the worker's pool
    has threads (``app.receipt_concurrency``, set when the worker starts), else the role's
    concurrency (``workers/roles.py``)."""
    slots: Slots | None = getattr(app, "receipt_slots", None)
    if slots is not None:
        return slots
    with _lock:
        slots = getattr(app, "receipt_slots", None)
        if slots is None:
            size = getattr(app, "receipt_concurrency", None) or concurrency(
                resolve_role(settings.process_role)[0], settings.execute_concurrency
            )
            slots = Slots(int(size))
            app.receipt_slots = slots
    return slots


def get_runtime(app: Celery) -> Runtime:
    rt: Runtime | None = getattr(app, "receipt_runtime", None)
    if rt is not None:
        return rt
    with _lock:
        rt = getattr(app, "receipt_runtime", None)
        if rt is None:
            settings: Settings = app.receipt_settings
            engine = engine_for(settings)
            client = DeliveryClient.through(app, settings)
            queue = build_queue(settings, engine=engine, on_dispatchable=client.wake, group_commit=True)
            registry = default_registry(settings.handler_modules.split(","))
            rt = Runtime(
                settings, app, engine, queue, registry, Callbacks(settings), client, probe_for(settings)
            )
            app.receipt_runtime = rt
    return rt
