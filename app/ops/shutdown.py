"""A process's planned shutdown (SIGTERM): what its grace allows, and the flag every part reads.

A platform restarts a process with SIGTERM and, a grace later, SIGKILL (Heroku and Render 30 s, Fly
5 s unless ``kill_timeout`` says otherwise). ``RECEIPT_SHUTDOWN_GRACE_MS`` is the whole budget from
the SIGTERM to the exit, split in two (``GracePlan``):

- the *finish* window: intake has stopped, running attempts go on and settle normally;
- the *stop* window (the last quarter, at least 1 s): each attempt still running is cancelled with
  reason ``shutdown`` (the sandbox kills its command tree), given half the window to stop, and
  handed back with ``job.released``: queued again at once and not charged to ``maxAttempts``.

So a platform's SIGKILL finds nothing left to lose. A crash (SIGKILL with no SIGTERM) never sets the
flag: its jobs come back through ``job.lease_expired`` (the worker-liveness loop), charged.

``PROCESS`` is the one flag of this process; the Celery wiring (``tasks/shutdown.py``) begins it on
``worker_shutting_down``, the runner (``workers/runner.py``) and the wake listener read it. Nothing
here knows about Celery.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from app.jobs.vocab import ReleaseReason

STOP_SHARE = 4  # the stop window is a quarter of the grace...
MIN_STOP_MS = 1000  # ...and at least this (a cancel, the command tree's kill and one write)

SHUTDOWN: Final[ReleaseReason] = "shutdown"  # the release reason, and the cancel reason a handler sees


@dataclass(frozen=True)
class GracePlan:
    """How a grace of ``grace_ms`` is spent (pure: unit-tested)."""

    grace_ms: int

    @property
    def stop_ms(self) -> int:
        """The last part of the grace: cancel, let the handler stop, release."""
        grace = max(0, self.grace_ms)
        return min(grace, max(MIN_STOP_MS, grace // STOP_SHARE))

    @property
    def finish_ms(self) -> int:
        """How long after the SIGTERM running attempts may still finish and settle normally."""
        return max(0, self.grace_ms) - self.stop_ms

    @property
    def handler_stop_ms(self) -> int:
        """How long a cancelled handler gets to stop before its attempt is released anyway: half the
        stop window, the other half kept for the release receipt's write (and its retries)."""
        return self.stop_ms // 2


class Shutdown:
    """Whether (and since when) this process is shutting down. Thread-safe; begun once."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._begun = threading.Event()
        self._at: float | None = None
        self._plan = GracePlan(0)

    def begin(self, grace_ms: int) -> bool:
        """Start the shutdown now (safe from a signal handler: no I/O, no waiting). True the first
        time; a second SIGTERM changes nothing, so the grace counts from the first."""
        with self._lock:
            if self._at is not None:
                return False
            self._at = self._clock()
            self._plan = GracePlan(grace_ms)
        self._begun.set()
        return True

    @property
    def requested(self) -> bool:
        return self._begun.is_set()

    @property
    def plan(self) -> GracePlan:
        return self._plan

    def wait(self, timeout: float) -> bool:
        """Block up to ``timeout`` seconds for the shutdown to begin; True once it has."""
        return self._begun.wait(timeout)

    def _seconds_until(self, after_ms: int) -> float | None:
        at = self._at
        if at is None:
            return None
        return max(0.0, at + after_ms / 1000 - self._clock())

    def seconds_to_cancel(self) -> float | None:
        """Seconds until running attempts are cancelled (0 once due); None when not shutting down."""
        return self._seconds_until(self._plan.finish_ms)

    def cancel_due(self) -> bool:
        left = self.seconds_to_cancel()
        return left is not None and left <= 0

    def seconds_left(self) -> float | None:
        """Seconds until the grace ends (0 once it has); None when not shutting down."""
        return self._seconds_until(self._plan.grace_ms)

    def reset(self) -> None:
        """Back to running (tests reuse one process for many workers)."""
        with self._lock:
            self._at = None
            self._plan = GracePlan(0)
            self._begun.clear()


PROCESS = Shutdown()
"""This process's shutdown: begun by SIGTERM (``tasks/shutdown.py``), read by every attempt."""
