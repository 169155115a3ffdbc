"""At most one dispatch pass per worker queue at a time in a process; the rest fold into one more.

Every freed place and every enqueue asks for a pass over its queue's line, and a process asks from
several threads at once (the driver's pool, its wake listener, the recovery loops). Passes of one
queue are serialised by the database anyway (``app.dispatch.line``: an advisory lock), so a second
pass asked for while one runs would only wait for the lock and then find the places the first left.
Instead it is folded: the asking thread returns at once, and the running thread makes one more
pass when its own ends, which sees every place freed meanwhile. Any number of asks during a pass
cost one pass more, so a deep line is refilled in batches, not a job at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


class PassGate:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running: set[str] = set()
        self._asked: set[str] = set()

    def run(self, queue: str, one_pass: Callable[[], list[T]]) -> list[T]:
        """Run ``one_pass`` for ``queue`` until no pass was asked for while it ran; return what the
        passes made. While another thread runs one, record the ask and return nothing."""
        with self._lock:
            if queue in self._running:
                self._asked.add(queue)
                return []
            self._running.add(queue)
        made: list[T] = []
        try:
            while True:
                made += one_pass()
                with self._lock:
                    if queue not in self._asked:
                        self._running.discard(queue)
                        return made
                    self._asked.discard(queue)
        except BaseException:
            with self._lock:
                # An ask folded into a pass that failed is not lost: the failing caller's own retry
                # (or the queued redrive) runs the line again, and it reads every place then.
                self._running.discard(queue)
                self._asked.discard(queue)
            raise
