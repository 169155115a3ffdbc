"""How many attempts this process runs at once: one counter that every delivery draws from.

A worker role's concurrency (``workers/roles.py``) bounds the attempts it runs, not the messages it
holds: a ``receipt.execute`` message runs one attempt, a ``receipt.execute_batch`` message several.
Both take their slots here before their first write, so a batch never runs more attempts than
the slots left beside it, and the process as a whole never more than its concurrency. The
consumer (``tasks/consumer.py``) fetches no message while every slot is taken, so a busy process
does not hold deliveries another one could start.
"""

from __future__ import annotations

import threading


class Slots:
    """A counting semaphore that hands out several slots at once and remembers its peak."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"slots need a capacity of 1 or more, got {capacity}")
        self.capacity = capacity
        self._cond = threading.Condition()
        self._in_use = 0
        self.peak = 0  # the most slots ever taken at once (tests, metrics)

    @property
    def in_use(self) -> int:
        return self._in_use

    @property
    def free(self) -> int:
        return self.capacity - self._in_use

    def take(self, want: int, timeout: float) -> int:
        """Take up to ``want`` slots: as many as are free now, waiting up to ``timeout`` seconds for
        the first one. Returns how many were taken (0 when none freed in time)."""
        if want < 1:
            return 0
        with self._cond:
            if not self._cond.wait_for(lambda: self._in_use < self.capacity, timeout):
                return 0
            got = min(want, self.capacity - self._in_use)
            self._in_use += got
            self.peak = max(self.peak, self._in_use)
            return got

    def take_leaving(self, want: int, leave: int) -> int:
        """Take up to ``want`` slots now, without waiting, so that at least ``leave`` stay free.
        Returns how many were taken (0 when no more than ``leave`` are free)."""
        with self._cond:
            got = max(0, min(want, self.capacity - self._in_use - leave))
            self._in_use += got
            self.peak = max(self.peak, self._in_use)
            return got

    def give(self, n: int = 1) -> None:
        """Return ``n`` slots (an attempt ended, or a slot taken for an attempt that did not start)."""
        if n < 1:
            return
        with self._cond:
            if n > self._in_use:
                raise RuntimeError(f"returning {n} slots, only {self._in_use} taken")
            self._in_use -= n
            self._cond.notify_all()
