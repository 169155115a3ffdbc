"""The composition root: the one place a ``Queue`` and its transition hooks are put together.

The API, the Celery workers and the web process's resume at startup build their queue with
``build_queue(settings, ...)``, so every process obeys every queue setting (the command cap, the
callback targets) alike and runs the same effects. ``queue_for`` is the same composition with
its options spelled out, for tests and tools. The hooks, in the order their halves run:

- ``DeliverySettlement`` (app/storage): in the transaction, ends the deliveries of an ended
  attempt, inside the transition's own statement;
- ``CallbackOutbox`` (app/storage): in the transaction, a terminal job's signed callback rows;
- ``DispatchWake`` (app/storage): after the commit, wakes the dispatch scanner for queued jobs;
- ``Observer`` (app/storage): after the commit, metrics;
- ``ControlOutbox`` (app/factory): in the transaction, a task job's objective control request;
  after the commit, that objective's control job (the fast path);
- ``Ledger`` (app/factory): after the commit, the durable ledger rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from sqlalchemy.engine import Engine

from app.config import Settings
from app.factory import service
from app.factory.hooks import ControlOutbox, Ledger
from app.jobs.reducer import Job
from app.ops import metrics
from app.storage.db import engine_for
from app.storage.hooks import CallbackOutbox, Change, DeliverySettlement, DispatchWake, Hook, Observer
from app.storage.queue import MAX_COMMANDS_PER_JOB_DEFAULT, Queue


def queue_for(
    engine: Engine,
    *,
    on_dispatchable: Callable[[Sequence[Job]], None] | None = None,
    max_commands_per_job: int = MAX_COMMANDS_PER_JOB_DEFAULT,
    callback_targets: Sequence[str] = (),
    control_fast_path: bool = True,
    on_applied: Callable[[Sequence[Change]], None] | None = None,
    ledger_in_background: bool = False,
    group_commit_max: int = 1,
    observe_group_commit: Callable[[int], None] | None = None,
) -> Queue:
    """A queue with every hook: ``on_dispatchable`` wakes delivery after a commit; the control
    fast path is off only in tests of the outbox redrive; long-lived processes write ledger rows
    in the background, tests and tools before each mutation returns."""
    hooks: list[Hook] = [
        DeliverySettlement(),
        CallbackOutbox(callback_targets),
        ControlOutbox(service.ensure_control_job, fast_path=control_fast_path),
        Ledger(engine, background=ledger_in_background),
    ]
    # After the commit: wake-up and metrics before the fast path and the ledger (the ledger is
    # bookkeeping, never on the path to the next job or control step).
    if on_applied is not None:
        hooks.insert(2, Observer(on_applied))
    if on_dispatchable is not None:
        hooks.insert(2, DispatchWake(on_dispatchable))
    return Queue(
        engine,
        hooks=hooks,
        max_commands_per_job=max_commands_per_job,
        group_commit_max=group_commit_max,
        observe_group_commit=observe_group_commit,
    )


def build_queue(
    settings: Settings,
    *,
    engine: Engine | None = None,
    on_dispatchable: Callable[[Sequence[Job]], None] | None = None,
    group_commit: bool = False,
) -> Queue:
    """The queue of a long-lived process: its settings, metrics, and ledger rows written in the
    background. ``on_dispatchable`` is how this process wakes the dispatch scanner after a commit.
    ``group_commit``: the process runs many transitions at once on threads (a Celery worker), so
    they share commits (``RECEIPT_GROUP_COMMIT_MAX``)."""
    return queue_for(
        engine if engine is not None else engine_for(settings),
        on_dispatchable=on_dispatchable,
        max_commands_per_job=settings.max_commands_per_job,
        callback_targets=settings.callback_targets,
        on_applied=metrics.observe,
        ledger_in_background=True,
        group_commit_max=settings.group_commit_max if group_commit else 1,
        observe_group_commit=metrics.observe_group_commit,
    )
