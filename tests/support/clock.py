"""A clock tests move by hand, for the loops' timing rules (``app.storage.loop_claims.Clock``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Timer:
    at: float
    fn: Callable[[], None]
    cancelled: bool = False


class ManualClock:
    """``monotonic`` moves only on ``advance_ms``, which runs, in the caller's thread, every
    ``call_later`` callback that has fallen due (in due order). Time is kept in whole milliseconds
    from 0, so a boundary like 5 000 ms is exact."""

    def __init__(self) -> None:
        self.now_ms = 0
        self._timers: list[_Timer] = []
        self._lock = threading.Lock()

    @property
    def now(self) -> float:
        return self.now_ms / 1000

    def monotonic(self) -> float:
        return self.now

    def call_later(self, delay_s: float, fn: Callable[[], None]) -> Callable[[], None]:
        timer = _Timer(self.now + delay_s, fn)
        with self._lock:
            self._timers.append(timer)

        def cancel() -> None:
            timer.cancelled = True

        return cancel

    def advance_ms(self, ms: int) -> None:
        with self._lock:
            self.now_ms += ms
            due = sorted((t for t in self._timers if t.at <= self.now), key=lambda t: t.at)
            self._timers = [t for t in self._timers if t.at > self.now]
        for timer in due:
            if not timer.cancelled:
                timer.fn()
