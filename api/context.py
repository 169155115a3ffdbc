"""The per-app objects a request needs, stored on ``app.extensions`` (no module globals)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from flask import current_app
from sqlalchemy.engine import Engine

from api.limits import StreamSlots
from api.token_cache import TokenCache
from api.watch import StreamPoller
from app.config import Settings
from app.jobs.reducer import Job
from app.storage.db import read_connection as read_connection
from app.storage.queue import Queue

EXTENSION = "receipt"


@dataclass
class ApiState:
    """What ``create_app`` wired together: settings, the engine, the queue, and a 500 counter.

    ``internal_errors`` counts requests that reached the catch-all handler; tests assert it stays
    zero, and an operator can alert on it.
    """

    settings: Settings
    engine: Engine
    queue: Queue
    internal_errors: int = 0
    # How often an open event stream sends a comment line, so idle proxies keep it open.
    sse_heartbeat_seconds: float = 15.0
    # What wakes the dispatch scanner after a commit (``api.wake``); ``/readyz`` checks it.
    waker: Callable[[Sequence[Job]], None] | None = None
    stream_slots: StreamSlots = field(init=False)
    # The one poller of this process's event streams (``api.watch``).
    poller: StreamPoller = field(init=False)
    # What token secrets stood for, reused for RECEIPT_TOKEN_CACHE_MS (``api.token_cache``).
    token_cache: TokenCache = field(init=False)

    def __post_init__(self) -> None:
        self.stream_slots = StreamSlots(
            self.settings.sse_max_streams_per_token, self.settings.sse_max_streams_per_process
        )
        self.poller = StreamPoller(self.engine, self.settings.sse_poll_ms)
        self.token_cache = TokenCache(self.settings.token_cache_ms)

    # When this app was built: /readyz gives a loop that never ran three intervals from here.
    started_monotonic: float = field(default_factory=time.monotonic)

    def count_internal_error(self) -> None:
        self.internal_errors += 1


def state() -> ApiState:
    """The current app's ``ApiState``."""
    value: ApiState = current_app.extensions[EXTENSION]
    return value
