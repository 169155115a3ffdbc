"""The Celery app factory, and the module-level app the ``celery`` command line loads.

``make_celery(settings)`` builds an app with Receipt's configuration and tasks registered; the
module attribute ``app`` exists only for ``celery -A tasks.celery_app`` (Flower, inspect).
"""

from __future__ import annotations

from typing import Any

from celery import Celery, signals

import celeryconfig
from app.config import Settings
from app.factory import watchdog
from app.jobs.routing import MAINTENANCE_QUEUE
from tasks import dispatch, execute, loops, objectives
from tasks.runtime import (
    DISPATCH_TASK,
    DRIVER_TASK,
    EXECUTE_TASK,
    EXPIRE_TASK,
    OUTBOX_TASK,
    REDRIVE_TASK,
    RETRY_TASK,
    WATCHDOG_TASK,
    get_runtime,
)


def make_celery(settings: Settings | None = None) -> Celery:
    settings = settings or Settings.from_env()
    app = Celery("receipt", set_as_current=False)
    app.config_from_object(celeryconfig.build(settings))
    app.receipt_settings = settings  # type: ignore[attr-defined]
    _register(app)
    return app


def _register(app: Celery) -> None:
    @app.task(name=DISPATCH_TASK, bind=True, ignore_result=True, shared=False)
    def dispatch_task(self: Any, job_ids: list[str]) -> dict[str, Any]:
        return dispatch.dispatch_jobs(get_runtime(self.app), job_ids)

    @app.task(name=DRIVER_TASK, bind=True, ignore_result=True, shared=False)
    def driver_task(self: Any, job_id: str, dispatch_key: str, generation: int) -> dict[str, Any]:
        return dispatch.drive(get_runtime(self.app), job_id, dispatch_key, generation)

    @app.task(name=EXECUTE_TASK, bind=True, ignore_result=True, shared=False)
    def execute_task(
        self: Any, job_id: str, fence: str, dispatch_key: str, generation: int
    ) -> dict[str, Any]:
        return execute.execute(get_runtime(self.app), job_id, fence, dispatch_key, generation)

    @app.task(name=REDRIVE_TASK, bind=True, ignore_result=True, shared=False)
    def redrive_task(self: Any) -> dict[str, Any]:
        return loops.redrive_queued(get_runtime(self.app))

    @app.task(name=EXPIRE_TASK, bind=True, ignore_result=True, shared=False)
    def expire_task(self: Any) -> dict[str, Any]:
        return loops.expire_leases(get_runtime(self.app))

    @app.task(name=RETRY_TASK, bind=True, ignore_result=True, shared=False)
    def retry_task(self: Any) -> dict[str, Any]:
        return loops.dispatch_due_retries(get_runtime(self.app))

    @app.task(name=OUTBOX_TASK, bind=True, ignore_result=True, shared=False)
    def outbox_task(self: Any) -> dict[str, Any]:
        rt = get_runtime(self.app)
        return objectives.outbox_redrive(
            rt.queue, rt.settings, lambda job, age_ms: dispatch.deliver_stale(rt, job, age_ms)
        )

    @app.task(name=WATCHDOG_TASK, bind=True, ignore_result=True, shared=False)
    def watchdog_tick_task(self: Any, published: str | None = None) -> dict[str, Any]:
        rt = get_runtime(self.app)
        return objectives.watchdog_tick(rt.queue, rt.settings, published)


@signals.before_task_publish.connect
def _stamp_watchdog_tick(sender: Any = None, body: Any = None, **_: Any) -> None:
    """Beat's watchdog message carries its publish time, so the tick is named by when beat fired
    (at or just after the cron tick), not by when a worker got round to it: two beats firing for
    one tick name the same tick however late their messages are consumed."""
    if sender != WATCHDOG_TASK or not isinstance(body, tuple) or len(body) < 2:
        return
    kwargs = body[1]
    if isinstance(kwargs, dict) and "published" not in kwargs:
        kwargs["published"] = objectives.utcnow_iso()


@signals.beat_init.connect
def _first_redrive_after_startup_delay(sender: Any = None, **_: Any) -> None:
    """Spec: the queued-job redrive's first pass runs after a 5 000 ms startup delay."""
    beat_app = getattr(sender, "app", None)
    settings: Settings | None = getattr(beat_app, "receipt_settings", None)
    if beat_app is None or settings is None:
        return
    if watchdog.enabled(settings):
        try:
            watchdog.cron_expression(settings)
        except watchdog.CronError as exc:  # `celery beat` started without tasks.beat's check
            raise SystemExit(f"beat: {exc}") from None
    beat_app.send_task(
        REDRIVE_TASK, queue=MAINTENANCE_QUEUE, countdown=settings.queued_redrive_startup_delay_ms / 1000
    )
    # Spec: objective resume runs once in every process role, after RESONATE_STARTUP_SETTLE_MS.
    objectives.schedule_resume(get_runtime(beat_app).queue, settings, "beat")


@signals.worker_ready.connect
def _resume_objectives_after_settle(sender: Any = None, **_: Any) -> None:
    """Spec: objective resume at startup runs once in every process role (single-flight)."""
    worker_app = getattr(sender, "app", None)
    if worker_app is None or getattr(worker_app, "receipt_settings", None) is None:
        return
    rt = get_runtime(worker_app)
    objectives.schedule_resume(rt.queue, rt.settings, rt.settings.process_role)


def __getattr__(name: str) -> Celery:
    # ``celery -A tasks.celery_app`` looks up ``app``; building it lazily keeps a plain import
    # (e.g. the API's waker) free of side effects such as creating the embedded broker folders.
    if name in ("app", "celery"):
        built = make_celery()
        globals()[name] = built
        return built
    raise AttributeError(name)
