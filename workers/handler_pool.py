"""Daemon threads that run job handlers, reused from one attempt to the next.

An attempt runs its handler off the worker's own thread, so the worker can race it against the
heartbeat loop, aborts and the execution timeout (``workers/runner.py``). Starting a thread per
attempt cost ~0.2 ms of CPU and, on a busy 2-core machine, up to ~1 ms before the handler ran.
Here a finished thread waits for the next handler instead.

A handler that never returns keeps its thread, exactly as a per-attempt thread would have been
kept: the next submission simply starts another. Threads are daemons, so a stuck handler never
holds the process's exit, and at most ``keep_idle`` wait idle; the rest end after their handler.
"""

from __future__ import annotations

import contextvars
import queue
import threading
from collections.abc import Callable
from typing import Any

KEEP_IDLE = 16


class HandlerRun:
    """One handler's run: ``join``/``is_alive`` like a thread's, then ``result`` or ``error``."""

    def __init__(self) -> None:
        self.result: Any = None
        self.error: BaseException | None = None
        self._done = threading.Event()

    def join(self, timeout: float | None = None) -> None:
        self._done.wait(timeout)

    def is_alive(self) -> bool:
        return not self._done.is_set()


class HandlerPool:
    def __init__(self, keep_idle: int = KEEP_IDLE) -> None:
        self._keep_idle = keep_idle
        self._work: queue.SimpleQueue[tuple[HandlerRun, contextvars.Context, Callable[[], Any]]] = (
            queue.SimpleQueue()
        )
        self._lock = threading.Lock()
        self._idle = 0  # threads that finished a handler and wait (or are about to) for the next
        self.started = 0  # threads started so far (tests)

    def submit(self, fn: Callable[[], Any]) -> HandlerRun:
        """Run ``fn`` on a pool thread, in a copy of the caller's context (its log fields)."""
        run = HandlerRun()
        with self._lock:
            reuse = self._idle > 0
            if reuse:
                self._idle -= 1  # that waiting thread takes this one (or another takes it first)
            else:
                self.started += 1
        # Every submission either reserves a waiting thread or starts one: none waits unserved.
        self._work.put((run, contextvars.copy_context(), fn))
        if not reuse:
            threading.Thread(target=self._serve, name="receipt-handler", daemon=True).start()
        return run

    def _serve(self) -> None:
        while True:
            run, context, fn = self._work.get()
            try:
                run.result = context.run(fn)
            except BaseException as exc:  # the attempt settles it; a thread must not die silently
                run.error = exc
            finally:
                run._done.set()
            with self._lock:
                if self._idle >= self._keep_idle:
                    return
                self._idle += 1
