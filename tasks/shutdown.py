"""SIGTERM wiring for every worker role and the driver (``app/ops/shutdown.py`` holds the decisions).

Celery's warm shutdown already stops the consumer at once (no new deliveries) and waits for the
running tasks. On ``worker_shutting_down`` (sent from the signal handler, in the main process)
this begins the process's shutdown with ``RECEIPT_SHUTDOWN_GRACE_MS`` and, off the signal handler,
stops what runs beside the tasks: the local ticker, and the driver's wake listener, whose taken but
unclaimed wake-ups go back on the wake list for the next driver (``delivery/dispatch.py``). Each running
attempt then finishes, or is cancelled and handed back, inside the grace (``workers/runner.py``).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from celery import Celery, signals

from app.config import Settings
from app.ops.shutdown import PROCESS
from workers import liveness as worker_liveness

log = logging.getLogger("receipt.shutdown")

# The apps of the workers this process started (one in production; the signal names a hostname).
_apps: list[Celery] = []
_lock = threading.Lock()


def _arm(sender: Any = None, **_: Any) -> None:
    app = getattr(sender, "app", None)
    if app is not None and getattr(app, "receipt_settings", None) is not None:
        with _lock:
            if app not in _apps:
                _apps.append(app)


def _begin(sig: Any = None, how: Any = None, **_: Any) -> None:
    """The first SIGTERM (or Ctrl-C) of a worker process: begin the grace. Signal-handler safe: it
    sets flags and starts one thread, nothing more."""
    with _lock:
        apps = list(_apps)
    if not apps:
        return
    settings: Settings = apps[0].receipt_settings
    if PROCESS.begin(settings.shutdown_grace_ms):
        threading.Thread(
            target=_stop_beside_tasks, args=(apps, sig), name="receipt-shutdown", daemon=True
        ).start()


def _stop_beside_tasks(apps: list[Celery], sig: Any) -> None:
    plan = PROCESS.plan
    log.warning(
        "%s: intake stopped; running attempts may finish for %d ms, then are handed back (grace %d ms)",
        sig or "shutdown",
        plan.finish_ms,
        plan.grace_ms,
    )
    # The dispatch pass stops counting this process's slots at its next read (docs/dispatch.md).
    live = worker_liveness.current()
    if live is not None:
        live.withdraw_offer()
    for app in apps:
        ticker = getattr(app, "receipt_ticker", None)
        if ticker is not None:
            ticker.stop()
        listener = getattr(app, "receipt_listener", None)
        if listener is not None:
            listener.stop()


def install() -> None:
    """Connect the wiring (idempotent: Celery's signals keep one receiver per function)."""
    signals.worker_init.connect(_arm)
    signals.worker_shutting_down.connect(_begin)
