"""The handler API: what a running handler is given, and how it reports failure.

A handler is ``Callable[[JobContext], Any]``: it returns the job's result (JSON) or raises
``HandlerError``. It receives its payload, a progress reporter, the pending queue commands
(consuming one writes ``queue.command.consumed``) and a cancellation signal set by ``abort``,
by losing the lease, by the execution timeout, or by the worker shutting down (reason
``shutdown``: the attempt is then handed back uncharged, and what the handler saved with
``progress`` is what its next attempt finds in ``ctx.checkpoint``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

from app.config import Settings
from app.jobs.reducer import Command, Job
from app.jobs.vocab import FailureStatus
from app.ops.shutdown import PROCESS, Shutdown
from app.storage.queue import Queue


class HandlerError(Exception):
    """A handler's failure. ``retryable`` decides between requeue and ``failed``.

    ``interrupted``: the work was stopped from outside (a command killed by a signal). While the
    worker is shutting down that is the shutdown, and the attempt is handed back uncharged instead.
    """

    def __init__(
        self,
        message: str,
        *,
        retryable: bool = True,
        status: FailureStatus = "failed",
        result: Mapping[str, Any] | None = None,
        interrupted: bool = False,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.retryable = retryable
        self.status = status
        self.result = dict(result) if result is not None else None
        self.interrupted = interrupted


class JobContext:
    """Everything a handler may use while it runs one attempt of one job."""

    def __init__(
        self,
        queue: Queue,
        job: Job,
        worker_id: str,
        attempt: int,
        settings: Settings,
        execution_timeout_ms: int,
        shutdown: Shutdown = PROCESS,
    ) -> None:
        self._queue = queue
        self.job = job
        self.worker_id = worker_id
        self.attempt = attempt
        self.settings = settings
        self.execution_timeout_ms = execution_timeout_ms
        self.cancelled = threading.Event()
        self.cancel_reason: str | None = None
        self._lock = threading.Lock()
        self._shutdown = shutdown

    @property
    def checkpoint(self) -> Any:
        """The progress the job held when this attempt started: what an earlier attempt saved with
        ``progress`` (one stopped by a shutdown saves where it got to, and this one resumes there)."""
        return self.job.progress

    @property
    def shutting_down(self) -> bool:
        """True once the worker has begun a planned shutdown (SIGTERM). The attempt may still finish
        within the grace; a handler that can checkpoint early may do so now. ``cancelled`` fires with
        reason ``shutdown`` when the grace's finish window is over."""
        return self._shutdown.requested

    @property
    def payload(self) -> Mapping[str, Any]:
        return self.job.payload

    @property
    def queue(self) -> Queue:
        """The queue this attempt runs under (the Factory handlers enqueue and read jobs through it)."""
        return self._queue

    def progress(self, value: Any) -> bool:
        """Append ``job.progress``; False if this attempt no longer holds the lease."""
        return self._queue.progress(self.job.id, self.worker_id, self.attempt, value).applied

    def commands(self) -> list[Command]:
        """Pending ``steer`` / ``follow_up`` commands, oldest first, each with the queue-command lane
        it was sent on (``Command.lane``); ``abort`` arrives as cancellation."""
        job = self._queue.get(self.job.id)
        if job is None:
            return []
        return [c for c in job.pending_commands if c.type != "abort"]

    def consume(self, command: Command) -> None:
        """Mark a command handled (``queue.command.consumed``)."""
        self._queue.consume_command(self.job.id, command.id)

    def cancel(self, reason: str) -> None:
        """Signal the handler to stop; the first reason wins."""
        with self._lock:
            if self.cancel_reason is None:
                self.cancel_reason = reason
        self.cancelled.set()

    def wait_cancelled(self, timeout: float) -> bool:
        """Sleep up to ``timeout`` seconds, waking at once on cancellation."""
        return self.cancelled.wait(timeout)


Handler = Callable[[JobContext], Any]
