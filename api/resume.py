"""Objective resume at startup in the web process (spec: "every process role, once").

Called from gunicorn's ``post_worker_init``: its own queue (``build_queue``) whose wake-up is the
API's publisher (``api.wake``), so the web process still imports no worker code.
"""

from __future__ import annotations

import logging
import threading

from api.wake import default_waker
from app.composition import build_queue
from app.config import Settings
from app.factory.recovery import schedule_resume

log = logging.getLogger("receipt.api")


def start_api_resume() -> threading.Timer | None:
    """Schedule the resume pass ``RESONATE_STARTUP_SETTLE_MS`` from now; None if it cannot start."""
    settings = Settings.from_env()
    try:
        queue = build_queue(settings, on_dispatchable=default_waker(settings))
    except Exception:
        log.exception("objective resume at startup (api) could not start")
        return None
    return schedule_resume(queue, settings, "api")
