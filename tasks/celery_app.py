"""The Celery app factory, and the module-level app the ``celery`` command line loads.

``make_celery()`` builds an app with Receipt's tasks registered that reads its configuration the
way a Celery user expects, ``config_from_object("celeryconfig")`` (built from the environment);
``make_celery(settings)`` builds the same configuration from the settings given (tests). The module
attribute ``app`` is for ``celery -A tasks.celery_app`` (beat, Flower, inspect).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, TypeVar

from celery import Celery, signals

import celeryconfig
from app.config import Settings
from app.dispatch.line import queues_field
from app.factory import recovery
from app.jobs.routing import DISPATCH_TASK, DRIVER_TASK, EXECUTE_BATCH_TASK, EXECUTE_TASK, QUEUES
from app.ops import logs, loop_registry
from app.schedules import declared
from app.storage.liveness import Offer
from delivery import dispatch, fetches, listeners
from tasks import redaction, shutdown
from tasks.beat import ReceiptBeat
from tasks.cron import CronSchedule
from workers import attempts, loop_passes
from workers import liveness as worker_liveness
from workers.runtime import get_runtime, slots_of

log = logging.getLogger("receipt.celery")


def make_celery(settings: Settings | None = None) -> Celery:
    missing = loop_passes.unbound()
    if missing:
        raise RuntimeError(
            f"recovery loops declared without a pass (workers/loop_passes.py): {', '.join(missing)}"
        )
    redaction.install()
    app = Celery("receipt", set_as_current=False)
    if settings is None:
        settings = celeryconfig.settings()
        app.config_from_object("celeryconfig")
    else:
        app.config_from_object(celeryconfig.build(settings))
    # The whole schedule, cron loops included: the plain-data configuration cannot build a cron
    # schedule without importing Celery.
    app.conf.beat_schedule = loop_registry.beat_schedule(settings, CronSchedule)
    # ``celery beat`` on this app runs Receipt's start-up first (tasks/beat.py).
    app.Beat = app.subclass_with_self(ReceiptBeat)
    app.receipt_settings = settings
    _register(app)
    return app


_F = TypeVar("_F", bound=Callable[..., Any])


def _task(app: Celery, name: str) -> Callable[[_F], _F]:
    """``app.task`` with Receipt's options, typed (Celery ships no type information).

    Bound, no result stored, and ``shared=False`` so two apps in one process (the tests build
    several) never share a task object.
    """
    decorator: Callable[[_F], _F] = app.task(name=name, bind=True, ignore_result=True, shared=False)
    return decorator


def _register(app: Celery) -> None:
    @_task(app, DISPATCH_TASK)
    def dispatch_task(self: Any, job_ids: list[str]) -> dict[str, Any]:
        return dispatch.dispatch_jobs(get_runtime(self.app), job_ids)

    @_task(app, DRIVER_TASK)
    def driver_task(self: Any, job_id: str, dispatch_key: str, generation: int) -> dispatch.DriveResult:
        return dispatch.drive(get_runtime(self.app), job_id, dispatch_key, generation)

    @_task(app, EXECUTE_TASK)
    def execute_task(
        self: Any, job_id: str, fence: str, dispatch_key: str, generation: int
    ) -> dict[str, Any]:
        return attempts.execute(
            get_runtime(self.app), job_id, fence, dispatch_key, generation, queue=_queue_of(self.request)
        )

    @_task(app, EXECUTE_BATCH_TASK)
    def execute_batch_task(self: Any, items: list[list[Any]]) -> dict[str, Any]:
        return attempts.execute_batch(get_runtime(self.app), items, queue=_queue_of(self.request))

    for loop in loop_registry.LOOPS:
        _register_loop(app, loop)


def _queue_of(request: Any) -> str | None:
    """The queue a worker message came from (each queue has its own routing key), for a hand-back."""
    info = getattr(request, "delivery_info", None) or {}
    key = info.get("routing_key") if isinstance(info, dict) else None
    return key if isinstance(key, str) and key else None


def _register_loop(app: Celery, loop: loop_registry.Loop) -> None:
    """The task carrying ``loop``'s ticks: one claimed pass (``workers.loop_passes.run``)."""

    @_task(app, loop.task)
    def loop_task(self: Any, published: str | None = None) -> dict[str, Any]:
        at = datetime.fromisoformat(published) if published else None
        return loop_passes.run(get_runtime(self.app), loop, at)


_CRON_TASKS = loop_registry.cron_tasks()


def _stamp_published(sender: Any = None, body: Any = None, **_: Any) -> None:
    """A cron loop's tick message carries its publish time, so the tick is named by when beat fired
    (at or just after the cron tick), not by when a worker got round to it: two beats firing for
    one tick name the same tick however late their messages are consumed."""
    if sender not in _CRON_TASKS or not isinstance(body, tuple) or len(body) < 2:
        return
    kwargs = body[1]
    if isinstance(kwargs, dict) and "published" not in kwargs:
        kwargs["published"] = datetime.now(UTC).isoformat()


signals.before_task_publish.connect(_stamp_published)


def _keep_receipt_logging(**_: Any) -> None:
    """Connected, so Celery leaves logging alone: ``app.ops.logs`` configured it (plain or JSON)."""


def _bind_job_to_logs(task: Any = None, args: Any = None, **_: Any) -> None:
    """Job fields on every log line of a driver or worker task, Celery's own "succeeded" line included.

    Bound here rather than inside the task function because Celery logs the task's outcome after
    the function returns but before ``task_postrun``, in the same thread.
    """
    name = getattr(task, "name", None)
    if name == DRIVER_TASK and args:
        logs.set_job(jobId=args[0])
    elif name == EXECUTE_TASK and args and len(args) >= 2:
        logs.set_job(jobId=args[0], fence=args[1])


def _unbind_job_from_logs(**_: Any) -> None:
    logs.clear_job()  # pool threads are reused: the next task must not inherit this job


def _first_passes_after_startup_delay(sender: Any = None, **_: Any) -> None:
    """Spec: the queued-job redrive's first pass runs after a 5 000 ms startup delay (every loop
    declaring a first delay gets its tick that long after beat starts)."""
    beat_app = getattr(sender, "app", None)
    settings: Settings | None = getattr(beat_app, "receipt_settings", None)
    if beat_app is None or settings is None:
        return
    errors = loop_registry.schedule_errors(settings)
    if errors:  # `celery beat` started without tasks.beat's check
        raise SystemExit(f"beat: {'; '.join(errors)}")
    for loop, delay_ms in loop_registry.first_passes(settings):
        beat_app.send_task(loop.task, queue=loop.queue, countdown=delay_ms / 1000)
    # Spec: objective resume runs once in every process role, after RESONATE_STARTUP_SETTLE_MS.
    recovery.schedule_resume(get_runtime(beat_app).queue, settings, "beat")
    _reconcile_schedules_file(settings, lambda: get_runtime(beat_app))


def _reconcile_schedules_file(settings: Settings, runtime: Callable[[], Any]) -> None:
    """``RECEIPT_SCHEDULES_FILE`` reconciled once at start (single-flight across the processes
    starting together), in the background: a start never waits on it, and a failure is logged."""
    path = settings.schedules_file
    if not path:
        return

    def run() -> None:
        try:
            declared.reconcile_once(runtime().queue, path)
        except Exception:
            log.exception("schedules file %s could not be reconciled; its schedules are as they were", path)

    threading.Thread(target=run, name="schedules-file", daemon=True).start()


def _reconcile_schedules_file_at_worker_start(sender: Any = None, **_: Any) -> None:
    """A worker that runs the schedules pass (it consumes its queue) reconciles the file too, so a
    beat-less deployment loads it."""
    worker_app = getattr(sender, "app", None)
    queues = getattr(worker_app, "receipt_ticker_queues", ()) if worker_app is not None else ()
    settings: Settings | None = getattr(worker_app, "receipt_settings", None) if worker_app else None
    if worker_app is None or settings is None or loop_registry.SCHEDULES.queue not in queues:
        return
    _reconcile_schedules_file(settings, lambda: get_runtime(worker_app))


def _resume_objectives_after_settle(sender: Any = None, **_: Any) -> None:
    """Spec: objective resume at startup runs once in every process role (single-flight)."""
    worker_app = getattr(sender, "app", None)
    if worker_app is None or getattr(worker_app, "receipt_settings", None) is None:
        return
    rt = get_runtime(worker_app)
    recovery.schedule_resume(rt.queue, rt.settings, rt.settings.process_role)


signals.beat_init.connect(_first_passes_after_startup_delay)
# Connected, so Celery leaves logging alone: app.ops.logs configured it (plain or JSON).
signals.setup_logging.connect(_keep_receipt_logging)
signals.task_prerun.connect(_bind_job_to_logs)
signals.task_postrun.connect(_unbind_job_from_logs)


def _start_local_ticker(sender: Any = None, **_: Any) -> None:
    """Recovery without beat: a worker runs the overdue loops whose ticks go to a queue it consumes."""
    worker_app = getattr(sender, "app", None)
    queues = getattr(worker_app, "receipt_ticker_queues", ()) if worker_app is not None else ()
    if worker_app is None or not queues:
        return
    rt = get_runtime(worker_app)
    if not any(loop.queue in queues for loop in loop_registry.active(rt.settings)):
        return
    ticker = loop_passes.LocalTicker(rt, queues)
    worker_app.receipt_ticker = ticker
    ticker.start()


signals.worker_ready.connect(_start_local_ticker)


def _start_wake_listener(sender: Any = None, **_: Any) -> None:
    """A driver process (``tasks.worker`` with a driver role) also listens on the wake list."""
    worker_app = getattr(sender, "app", None)
    if worker_app is None or not getattr(worker_app, "receipt_wake_listener", False):
        return
    rt = get_runtime(worker_app)
    if rt.wakes is None:
        return  # not a Redis broker: every wake-up is a message
    listener = listeners.WakeListener(rt)
    worker_app.receipt_listener = listener
    listener.start()


def _stop_wake_listener(sender: Any = None, **_: Any) -> None:
    worker_app = getattr(sender, "app", None)
    listener = getattr(worker_app, "receipt_listener", None) if worker_app is not None else None
    if listener is not None:
        listener.stop()


def _start_refill(sender: Any = None, **_: Any) -> None:
    """A process that runs attempts refills the places they free itself (``listeners.Refill``),
    where the broker's Redis keeps the lines' marks; elsewhere its ended jobs wake the driver."""
    worker_app = getattr(sender, "app", None)
    if worker_app is None or getattr(worker_app, "receipt_settings", None) is None:
        return
    offer = _offer(sender, worker_app)
    rt = get_runtime(worker_app)
    if offer is None or rt.wakes is None:
        return
    queues = offer.queues.split()
    settings = rt.settings
    # A driver process already listens; its listener does not run attempts. Nor can a process whose
    # only slot is the one always left for a waiting message: its scans would only send messages.
    listens = (
        settings.worker_wakes
        and not getattr(worker_app, "receipt_wake_listener", False)
        and offer.slots > attempts.LEAVE_FOR_MESSAGES
    )
    runs = attempts.LocalRuns(rt, queues) if settings.delivery_local or listens else None
    worker_app.receipt_local_runs = runs
    if settings.delivery_local:
        rt.local = runs
    refill = listeners.Refill(rt, queues)
    worker_app.receipt_refill = refill
    refill.start()
    if listens:
        # Only the listener's passes keep what they claim here: the refill's follow
        # RECEIPT_DELIVERY_LOCAL (a place it frees goes first to a message already waiting).
        # On the wake lists of its worker queues (the offer's: never beat's queues).
        listener = listeners.WakeListener(replace(rt, local=runs), queues=queues)
        worker_app.receipt_worker_listener = listener
        listener.start()


def _stop_refill(sender: Any = None, **_: Any) -> None:
    """At shutdown, after the consumer's tasks: the worker's wake listener (which hands back what it
    took and did not scan), the refill, then the attempts run without a message, which finish or
    hand theirs back within the grace."""
    worker_app = getattr(sender, "app", None)
    if worker_app is None:
        return
    listener = getattr(worker_app, "receipt_worker_listener", None)
    if listener is not None:
        listener.stop()
    refill = getattr(worker_app, "receipt_refill", None)
    if refill is not None:
        refill.stop()
    runs = getattr(worker_app, "receipt_local_runs", None)
    rt = getattr(worker_app, "receipt_runtime", None)
    if runs is not None and rt is not None:
        runs.stop(rt.settings.shutdown_grace_ms / 1000)


def _write_pending_ledger_rows(sender: Any = None, **_: Any) -> None:
    """At shutdown: the ledger rows the background writer still holds (up to its 50 ms gather)."""
    worker_app = getattr(sender, "app", None)
    rt = getattr(worker_app, "receipt_runtime", None) if worker_app is not None else None
    if rt is not None:
        rt.queue.close()


def _start_liveness(sender: Any = None, **_: Any) -> None:
    """Before the first delivery: this process's liveness record and its self-fence."""
    worker_app = getattr(sender, "app", None)
    role = getattr(worker_app, "receipt_liveness_role", None) if worker_app is not None else None
    if worker_app is None or role is None:
        return
    settings = get_runtime(worker_app).settings
    live = worker_liveness.ProcessLiveness(
        worker_liveness.liveness_engine(settings), settings, role, offer=_offer(sender, worker_app)
    )
    worker_liveness.install(live)
    live.start()


def _offer(worker: Any, worker_app: Any) -> Offer | None:
    """What this process offers the dispatch pass: the worker queues its consumer reads (``-Q`` or
    its role's) and its slots (its pool's threads, as ``_size_slots`` sizes them)."""
    consumed = getattr(getattr(worker_app.amqp, "queues", None), "consume_from", None) or {}
    queues = [q for q in consumed if q in QUEUES.values()]
    size = getattr(worker, "concurrency", None)
    if not queues:
        return None
    slots = (
        size
        if isinstance(size, int) and size > 0
        else slots_of(worker_app, worker_app.receipt_settings).capacity
    )
    return Offer(queues_field(queues), slots)


def _size_slots(sender: Any = None, **_: Any) -> None:
    """The process's slots (``workers/runtime.py``) are as many as its pool's threads, made before
    its consumer starts, which stops fetching while they are all taken (``tasks/consumer.py``)."""
    worker_app = getattr(sender, "app", None)
    size = getattr(sender, "concurrency", None)
    if worker_app is None or getattr(worker_app, "receipt_settings", None) is None:
        return
    if isinstance(size, int) and size > 0:
        worker_app.receipt_concurrency = size
    slots_of(worker_app, worker_app.receipt_settings)


def _stop_liveness(sender: Any = None, **_: Any) -> None:
    live = worker_liveness.current()
    if live is not None:
        live.stop()
        live.engine.dispose()
        worker_liveness.install(None)


signals.worker_init.connect(_start_liveness)
signals.worker_init.connect(_size_slots)
signals.worker_shutdown.connect(_stop_liveness)
signals.worker_ready.connect(_start_wake_listener)
signals.worker_shutdown.connect(_stop_wake_listener)
signals.worker_ready.connect(_start_refill)
signals.worker_shutdown.connect(_stop_refill)
signals.worker_shutdown.connect(_write_pending_ledger_rows)
# Who fetched which message, and which consumers are alive (delivery/fetches.py): a delivery whose
# message died with its fetcher is redelivered within seconds instead of the driver timeout.
signals.worker_init.connect(fetches.on_worker_init)
signals.task_received.connect(fetches.on_task_received)
signals.before_task_publish.connect(fetches.on_before_task_publish)
signals.task_failure.connect(fetches.on_task_failure)
signals.worker_ready.connect(_resume_objectives_after_settle)
# SIGTERM: stop intake, let attempts finish within the grace, hand the rest back (tasks/shutdown.py).
shutdown.install()
signals.worker_ready.connect(_reconcile_schedules_file_at_worker_start)


def __getattr__(name: str) -> Celery:
    # ``celery -A tasks.celery_app`` looks up ``app``; building it lazily keeps a plain import
    # (e.g. the API's waker) free of side effects such as creating the embedded broker folders.
    if name in ("app", "celery"):
        built = make_celery()
        globals()[name] = built
        return built
    raise AttributeError(name)
