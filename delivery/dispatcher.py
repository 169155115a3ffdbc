"""What a process that dispatches holds: the parts and the per-process state of its passes.

``delivery/dispatch.py`` acts through a ``Dispatcher``: the settings, the database, the queue, the
webhook outbox, the delivery client and its broker probe, and what this process remembers of its
own passes. A worker process's runtime (``workers/runtime.py``) extends it with what running an
attempt needs (handlers, slots); nothing here knows about Celery or about running attempts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy.engine import Engine

from app.config import Settings
from app.dispatch.fast import Rooms
from app.dispatch.gate import PassGate
from app.dispatch.line import PassResult
from app.storage.queue import Queue
from delivery.broker import BrokerProbe, NullProbe
from delivery.callbacks import Callbacks
from delivery.client import DeliveryClient
from delivery.wakes import WakeList


class LocalRunner(Protocol):
    """Runs here what this process's own passes claimed for its free slots, with no message
    (``RECEIPT_DELIVERY_LOCAL``; ``workers.attempts.LocalRuns``)."""

    def reserve(self, queue: str, want: int) -> int: ...

    def release(self, n: int) -> None: ...

    def run(self, queue: str, items: list[list[Any]]) -> None: ...


@dataclass(kw_only=True)
class Dispatcher:
    settings: Settings
    engine: Engine
    queue: Queue
    callbacks: Callbacks
    # Sends the driver's and worker messages and the wake-ups.
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
    # A worker process's runs of what its own passes claimed for its free slots.
    local: LocalRunner | None = None

    @property
    def wakes(self) -> WakeList | None:
        """The coalescing wake list (Redis brokers only): the scanner drains it (delivery/wakes.py)."""
        return self.delivery.wakes
