"""Every Celery setting Receipt uses, built from the one ``Settings`` object (the environment).

The governing decision: Celery *delivers*; Postgres receipts *decide*. A worker must win a
fenced lease before doing any work and every write passes that fence, so a redelivered, lost
or duplicated message is harmless — recovery comes from the lease-expiry and queued-redrive
loops reading receipts, never from the broker's redelivery. The settings below are chosen for
that design (the measured facts behind each are in docs/design.md, "Delivery over Celery").

It is the module a Celery user looks for: ``app.config_from_object("celeryconfig")`` reads every
setting below as a module attribute, built from the environment's ``Settings`` on first access
(``__getattr__``): what ``celery -A tasks.celery_app …`` loads (the Procfile's beat, inspect).
A caller holding its own ``Settings`` (the worker entry points, the API's publisher, the tests)
passes ``build(settings)``, the same mapping. It is installed with the package (``py-modules`` in
pyproject.toml), and it is plain data: it imports neither Celery nor kombu, and names the modules
Celery loads by string, so the web process configures its publish-only client from it without
importing worker code.
A function computing one setting is named ``<setting>_for``: the setting's own name is the value.
"""

from __future__ import annotations

import functools
from typing import Any

from app.config import Settings
from app.jobs.routing import DRIVER_QUEUE, MAINTENANCE_QUEUE, OBJECTIVES_QUEUE, QUEUES
from app.ops import loop_registry
from app.storage.files import private_dir

ALL_QUEUES = (DRIVER_QUEUE, *QUEUES.values(), MAINTENANCE_QUEUE, OBJECTIVES_QUEUE)
EMBEDDED_POLL_S = 0.05


# The folder broker ignores the host, but kombu warns "No hostname was supplied" on every
# connection without one; naming localhost removes the cause instead of hiding the warning.
EMBEDDED_BROKER_URL = "filesystem://localhost/"


def broker_url_for(settings: Settings) -> str:
    return settings.redis_url or EMBEDDED_BROKER_URL


# kombu's Redis transport with one synchronous client per pool (delivery/redis_transport.py): a
# string, loaded by kombu when a connection opens. Every publisher loads it, the web process too,
# so it lives in ``delivery/`` and never under ``tasks/`` or ``workers/`` (tests/unit/test_layers.py).
REDIS_TRANSPORT = "delivery.redis_transport:Transport"
# kombu's folder transport with atomic writes and dead letters (delivery/folder_transport.py).
FOLDER_TRANSPORT = "delivery.folder_transport:Transport"


def broker_transport_for(settings: Settings) -> str | None:
    """The kombu transport for the broker URL: ours for plain Redis and the embedded folder broker,
    else the URL's own."""
    if not settings.redis_url:
        return FOLDER_TRANSPORT
    scheme = settings.redis_url.split("://", 1)[0]
    return REDIS_TRANSPORT if scheme in ("redis", "rediss") else None


def broker_transport_options_for(settings: Settings) -> dict[str, Any]:
    if settings.redis_url:
        # No ack emulation (kombu's Redis option): a fetched message lives in its consumer's
        # memory only, as with early ack it does for an instant anyway. kombu's emulation kept a
        # copy of every delivered message in Redis until the ack (two pipelined transactions per
        # message, ~20 % of a worker's CPU: bench/README.md) to restore it after a visibility
        # timeout — a duplicate hours later, which Receipt never relies on: a message lost with
        # its fetcher is recovered from PostgreSQL within seconds (delivery/fetches.py, the queued
        # redrive, lease expiry). A warm shutdown still puts back what it fetched and did not start.
        return {"ack_emulation": False}
    # Embedded default: a folder broker shared by the local processes. Every folder is set
    # explicitly (the control folder otherwise defaults to ./control of the current directory).
    private_dir(settings.home_path)
    root = settings.home_path / "broker"
    folders = {name: root / name for name in ("data", "control", "processed", "claimed", "dead")}
    for path in folders.values():
        path.mkdir(parents=True, exist_ok=True)
    return {
        "data_folder_in": str(folders["data"]),
        "data_folder_out": str(folders["data"]),
        "control_folder": str(folders["control"]),
        "processed_folder": str(folders["processed"]),
        "claim_folder": str(folders["claimed"]),
        "dead_letter_folder": str(folders["dead"]),
        "store_processed": False,
        "polling_interval": EMBEDDED_POLL_S,
    }


def task_queues_for() -> dict[str, dict[str, str]]:
    """Each queue with its own direct exchange and routing key, in Celery's mapping form.

    A bare ``Queue(name)`` list bound every queue to one exchange/key in a measured test. Celery
    turns each entry into ``Queue(name, Exchange(name, type="direct"), routing_key=name)``.
    """
    return {name: {"exchange": name, "exchange_type": "direct", "routing_key": name} for name in ALL_QUEUES}


def beat_schedule_for(settings: Settings) -> dict[str, Any]:
    """Beat's schedule, derived from the loop registry (``app/ops/loop_registry.py``). Plain data: the cron
    loops need a Celery schedule object, which ``tasks/celery_app.py`` adds (``CronSchedule``)."""
    return loop_registry.beat_schedule(settings)


def build(settings: Settings) -> dict[str, Any]:
    """The Celery configuration mapping for ``app.config_from_object``."""
    redis = bool(settings.redis_url)
    conf: dict[str, Any] = {
        "broker_url": broker_url_for(settings),
        "broker_transport": broker_transport_for(settings),
        "broker_transport_options": broker_transport_options_for(settings),
        "task_queues": task_queues_for(),
        "task_default_queue": DRIVER_QUEUE,
        "task_default_exchange": DRIVER_QUEUE,
        "task_default_routing_key": DRIVER_QUEUE,
        # An unknown queue is a deployment error: fail at start instead of inventing a queue.
        "task_create_missing_queues": False,
        # Early ack: a message is acked when its execution starts. A broker blip then cannot
        # requeue (and rerun) a one-hour codex job; a worker that dies loses only the message,
        # and lease expiry + redrive bring the job back from receipts.
        "task_acks_late": False,
        # A killed pool child's message is acked, not rerun: no crash loops; maxAttempts bounds
        # retries through lease expiry instead.
        "task_reject_on_worker_lost": False,
        # Keep running work running when the broker connection drops (default flips in Celery 6).
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        # One message at a time per slot: a busy worker must not hoard the next job while
        # another idles.
        "worker_prefetch_multiplier": 1,
        # Reconnect forever, doubling 1 s → 30 s (tasks/consumer.py), including at start-up.
        "broker_connection_retry_on_startup": True,
        "broker_connection_max_retries": None,
        "worker_consumer": "tasks.consumer:BackoffConsumer",
        # No result backend: job state is the fold of receipts, never Celery's task state.
        "task_ignore_result": True,
        "result_backend": None,
        "task_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        # Task events are off unless asked for: they cost about half of every publish and a few
        # ms of CPU per job. Flower broadcasts enable_events when it starts, so its task views
        # work anyway; RECEIPT_CELERY_EVENTS=enabled turns them on from the first task.
        "worker_send_task_events": settings.celery_events,
        "task_send_sent_event": settings.celery_events,
        "timezone": "UTC",
        "enable_utc": True,
        "beat_schedule": beat_schedule_for(settings),
        "beat_schedule_filename": str(settings.home_path / "celerybeat-schedule"),
        "worker_hijack_root_logger": False,
    }
    if redis:
        # Redis only (Celery 5.7): do not prefetch at all, so a long job never holds the next one.
        conf["worker_disable_prefetch"] = True
    return conf


@functools.cache
def settings() -> Settings:
    """The environment's settings this module's attributes are built from (read once per process)."""
    return Settings.from_env()


@functools.cache
def configuration() -> dict[str, Any]:
    """``build(settings())``: what ``config_from_object("celeryconfig")`` reads, built on first use so
    a plain import has no side effect (the embedded broker's folders are made here)."""
    return build(settings())


def __getattr__(name: str) -> Any:
    # PEP 562: a setting is a module attribute, computed on first access. Private and dunder names
    # are never settings (the import machinery probes some).
    if not name.startswith("_"):
        conf = configuration()
        if name in conf:
            return conf[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    # Celery lists a configuration module's keys with dir(): the settings only, so the helpers and
    # imports above never become (unknown) keys of an app's configuration.
    return sorted(configuration())
