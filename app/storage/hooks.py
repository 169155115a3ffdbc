"""Transition hooks: what a job transition causes beyond its own receipts, each effect in one place.

A hook has two halves, each optional (Dramatiq's middleware, with each hook's failure isolated):

- ``during(change)``, in the transition's transaction, returns the write this change also needs:
  a ``Companion`` (a statement that rides in the transition's own statement, so a hot
  transition stays one round trip on PostgreSQL) or a ``Write`` (it needs the transaction: the
  queue then runs the transition in one). Whatever a ``Write`` returns is handed to ``after``.
- ``after(changes, results)``, after the commit, for effects that must never fail or slow the
  committed mutation: each hook's failure is logged and swallowed, and the next hook still runs.

``Queue`` knows only this protocol. The hooks are composed at one root (``app/composition.py``):
delivery settlement, the callback outbox, the dispatch wake-up and metrics here in storage; the
objective control outbox and the durable ledger in ``app/factory``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.engine import Connection

from app.jobs.reducer import Job
from app.jobs.vocab import TERMINAL_STATUSES
from app.storage import delivery, outbox
from app.storage.direct import Direct

log = logging.getLogger("receipt.queue")


@dataclass(frozen=True)
class Change:
    """Receipts one transition appended to one job: the state before and after, their types, and
    the database time they carry."""

    before: Job | None
    after: Job
    types: tuple[str, ...]
    now: datetime

    @property
    def status_changed(self) -> bool:
        return self.before is not None and self.before.status != self.after.status

    @property
    def ended(self) -> bool:
        """This change took a job that existed and was not terminal to a terminal status."""
        return self.after.terminal and self.before is not None and self.before.status not in TERMINAL_STATUSES


@dataclass(frozen=True)
class Companion:
    """A write that rides in the transition's own statement: a built statement and its parameters."""

    statement: Direct
    params: Mapping[str, Any]


@dataclass(frozen=True)
class Write:
    """A write in the transition's transaction; what ``run`` returns goes to the hook's ``after``."""

    run: Callable[[Connection], Any]


class Hook:
    """A transition hook (see the module doc). Subclasses override the halves they need."""

    name = "hook"

    def during(self, change: Change) -> Companion | Write | None:
        return None

    def after(self, changes: Sequence[Change], results: Sequence[Any]) -> None:
        return None

    def bind(self, queue: Any) -> None:
        """Told which queue it is registered on (a hook whose after-commit half enqueues jobs)."""

    def close(self) -> None:
        """Finish what the hook still holds (a process shutting down)."""


class DeliverySettlement(Hook):
    """A receipt that ends the attempt (or the wait) its deliveries were started for ends them in
    the same statement, so no delivery record outlives its purpose."""

    name = "delivery-settlement"

    def during(self, change: Change) -> Companion | None:
        if not change.status_changed or not (change.after.terminal or change.after.status == "queued"):
            return None
        outcome = change.types[-1].removeprefix("job.")
        return Companion(
            delivery.SETTLE_JOB, delivery.settle_job_params(change.after.id, outcome, change.now)
        )


class CallbackOutbox(Hook):
    """A job's terminal receipt writes its signed callbacks' outbox rows in its own transaction."""

    name = "callback-outbox"

    def __init__(self, targets: Sequence[str]) -> None:
        self.targets = tuple(targets)

    def during(self, change: Change) -> Write | None:
        if not self.targets or not change.ended:
            return None
        job, now = change.after, change.now
        return Write(lambda conn: outbox.record(conn, self.targets, job.status, job, now))


class DispatchWake(Hook):
    """After a commit, wake the dispatch scanner for the jobs it left queued, and for the worker
    queues of the jobs it ended, whose places are free for the next in line (best effort: the
    queued redrive wakes every line a lost wake-up leaves waiting)."""

    name = "dispatch-wake"

    def __init__(self, wake: Callable[[Sequence[Job]], None]) -> None:
        self.wake = wake

    def after(self, changes: Sequence[Change], results: Sequence[Any]) -> None:
        last = {c.after.id: c.after for c in changes}  # each job as the transaction left it
        ended = {c.after.id for c in changes if c.ended}
        ready = [j for j in last.values() if j.status == "queued" or j.id in ended]
        if not ready:
            return
        try:
            self.wake(ready)
        except Exception:
            log.exception("dispatch wake-up failed; the queued redrive will pick these jobs up")


class Observer(Hook):
    """Hands every committed change to an observer (metrics count from these; nothing decides)."""

    name = "observer"

    def __init__(self, observe: Callable[[Sequence[Change]], None]) -> None:
        self.observe = observe

    def after(self, changes: Sequence[Change], results: Sequence[Any]) -> None:
        self.observe(changes)


def run_after(hooks: Sequence[Hook], changes: Sequence[Change], results: Mapping[int, list[Any]]) -> None:
    """Every hook's after-commit half, in order, each failure isolated and logged."""
    if not changes:
        return
    for index, hook in enumerate(hooks):
        try:
            hook.after(changes, results.get(index, []))
        except Exception:  # an effect after the commit never fails the committed mutation
            log.exception("transition hook %s failed after commit", hook.name)
