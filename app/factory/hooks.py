"""The Factory's two transition hooks: the objective control outbox and the durable ledger.

Both hang on job transitions (``app/storage/hooks.py``) without the job queue knowing objectives:

- ``ControlOutbox``: a task job's transition that its kind contract says reconciles its objective
  (settled, or its lease expired) writes the objective's control request **in the job's own
  transaction** (the outbox: no settlement can be lost). After the commit, the fast path enqueues
  the control job at once; the outbox redrive catches whatever it misses.
- ``Ledger``: after the commit, the durable ledger rows the transition changed are written, best
  effort, on a background thread in long-lived processes (``app/factory/ledger.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection, Engine

from app.factory import ledger, outbox, storage
from app.factory.reducer import Objective
from app.storage.hooks import Change, Hook, Write

if TYPE_CHECKING:
    from app.storage.queue import Queue

log = logging.getLogger("receipt.factory")


# Enqueue the control job of an objective (``service.ensure_control_job``), given the objective as
# the request's transaction left it.
EnsureControl = Callable[..., Any]


class ControlOutbox(Hook):
    """The control outbox, and its after-commit fast path: ``ensure`` enqueues the control job
    (``service.ensure_control_job``, passed in by the composition root). ``fast_path=False`` only in
    tests of the outbox redrive, which must find the requests the fast path would have taken."""

    name = "objective-control"

    def __init__(self, ensure: EnsureControl, *, fast_path: bool = True) -> None:
        self.ensure = ensure
        self.fast_path = fast_path
        self.queue: Queue | None = None  # the queue the fast path enqueues on (``bind``)

    def bind(self, queue: Queue) -> None:
        self.queue = queue

    def during(self, change: Change) -> Write | None:
        body = outbox.control_request_for(change.before, change.after, change.types)
        if body is None:
            return None
        job = change.after

        def write(conn: Connection) -> tuple[str, Objective] | None:
            # The payload names the objective as its organisation knows it: only that organisation's.
            key = storage.key_of(conn, job.organization_id, str(job.payload["objectiveId"]))
            if key is None:
                return None
            # Its own clock read, after the objective's lock: the objective stream's times never go back.
            written = storage.request_control(
                conn, key, body, organization_id=job.organization_id, check_organization=True
            )
            return None if written is None else (key, written)

        return Write(write)

    def after(self, changes: Sequence[Change], results: Sequence[Any]) -> None:
        if not self.fast_path or self.queue is None:
            return
        # Each objective as its newest request here left it: the fast path need not read it again.
        requested: dict[str, Objective] = {}
        for result in results:
            if result is not None:
                key, obj = result
                requested[key] = obj
        for key in sorted(requested):
            try:
                self.ensure(self.queue, key, known=requested[key])
            except Exception:  # best-effort: the outbox redrive enqueues what this misses
                log.exception("control fast path for %s failed; the outbox redrive will catch it", key)


class Ledger(Hook):
    """Durable ledger rows after the commit; ``background``: written off the mutation's path,
    batched (long-lived processes); otherwise before the mutation returns (tests and tools)."""

    name = "durable-ledger"

    def __init__(self, engine: Engine, *, background: bool = False) -> None:
        self.engine = engine
        self.writer = ledger.BackgroundWriter(engine) if background else None

    def after(self, changes: Sequence[Change], results: Sequence[Any]) -> None:
        changed = [
            c.after
            for c in changes
            if ledger.tracked(c.after.kind) and any(t in ledger.LEDGER_EVENTS for t in c.types)
        ]
        if changed:
            ledger.after_commit(self.engine, changed, self.writer)  # logs and swallows its own failures

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
