"""gunicorn settings for the web process: ``gunicorn -c api/gunicorn_conf.py api.wsgi:app``.

Worker class: **gevent**. An event stream (``/jobs/<id>/events``) holds its request open for up
to ``RECEIPT_SSE_MAX_SECONDS`` while mostly sleeping between polls. With sync workers each open
stream would pin a whole process, and a handful of followers would starve every other request;
gthread would pin a thread each and cap streams at ``threads``. A gevent worker runs each
request in a greenlet, so thousands of idle streams cost almost nothing and ordinary requests
keep flowing. Two things make that true rather than hopeful:

- ``psycogreen`` installs psycopg2's wait callback (``post_fork``), so a database round trip
  yields to other greenlets instead of blocking the whole worker (psycopg2 is a C extension
  that gevent's monkey-patching cannot reach on its own).
- gevent's worker sends its heartbeat to the arbiter from its own greenlet, so ``timeout`` is
  about a *stuck worker*, not a long request: open streams are not killed at 30 s.

A restart drains (SIGTERM): the worker stops accepting at once, every open event stream ends with
a short ``retry:`` (its client resumes on the next process from ``Last-Event-ID``, missing and
repeating nothing), and in-flight requests finish, all within ``graceful_timeout``, which is kept
inside ``RECEIPT_SHUTDOWN_GRACE_MS`` (one second under it, at least one second).

Environment (PaaS conventions): ``PORT`` (default 8080), ``WEB_CONCURRENCY`` worker processes
(default 2, one per core of the reference machine), ``WEB_WORKER_CONNECTIONS`` greenlets per
worker (default 1000). Command-line flags (e.g. ``-b 127.0.0.1:9000``) override these.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import warnings
from typing import Any

from api import access_log
from app import tracing
from app.config import Settings
from app.ops import logs, metrics, outages, preflight

bind = f"0.0.0.0:{os.environ.get('PORT', '8080')}"
workers = int(os.environ.get("WEB_CONCURRENCY", "2"))
worker_class = "gevent"
worker_connections = int(os.environ.get("WEB_WORKER_CONNECTIONS", "1000"))
timeout = 30
_SETTINGS = Settings.from_env()
# gunicorn's master imports ssl before the gevent worker patches it, so every worker start warns
# (MonkeyPatchWarning). Nothing in the master builds an SSL object a worker then uses: the app and
# its connections (rediss:// included) are made after the patch, in the worker, so the warning
# says nothing here. The filter is inherited by each worker through the fork.
warnings.filterwarnings("ignore", message="Monkey-patching ssl after ssl has already been imported")
graceful_timeout = max(1, _SETTINGS.shutdown_grace_ms // 1000 - 1)
DRAIN_WATCH_S = 0.1  # how often a worker looks whether it was told to stop
keepalive = 5
# Build the app in each worker after fork (and after gevent patches): no engine crosses a fork.
preload_app = False
errorlog = "-"
loglevel = os.environ.get("GUNICORN_LOG_LEVEL", "info")
# gunicorn's own lines and the app's share Receipt's one logging configuration (plain or JSON).
logconfig_dict = logs.dict_config(_SETTINGS, "web")
# The access line per request only with RECEIPT_ACCESS_LOG=enabled; requests are counted either way.
logger_class = access_log.logger_class(_SETTINGS)


# Prometheus multiprocess mode: each gunicorn worker writes its counters to files in one folder,
# and whichever worker answers /metrics adds them up. Set here, in the master, before any worker
# imports prometheus_client. An operator's (or `receipt up`'s) PROMETHEUS_MULTIPROC_DIR is used
# as given; otherwise a fresh folder per start, removed at exit, so no stale counts survive.
_OWN_METRICS_DIR = (
    None if os.environ.get(metrics.MULTIPROC_ENV) else tempfile.mkdtemp(prefix="receipt-metrics-")
)
metrics.prepare_multiprocess_dir(_OWN_METRICS_DIR)


def on_starting(server: Any) -> None:
    """In the master, before any worker: a wrong DATABASE_URL or REDIS_URL, or an
    OTEL_TRACES_EXPORTER naming no installed exporter, stops the web in one line."""
    try:
        tracing.check()
    except ValueError as exc:
        raise SystemExit(f"tracing: {exc}") from None
    settings = Settings.from_env()
    preflight.require(
        settings, database=preflight.Schema.HEAD, broker=True, log=logging.getLogger("receipt.preflight")
    )


def child_exit(server: Any, worker: Any) -> None:
    metrics.mark_process_dead(worker.pid)


def on_exit(server: Any) -> None:
    if _OWN_METRICS_DIR is not None:
        shutil.rmtree(_OWN_METRICS_DIR, ignore_errors=True)


def worker_exit(server: Any, worker: Any) -> None:
    """Write the ledger rows the API's background writer still holds (up to its 50 ms gather)."""
    from api.context import EXTENSION

    state = getattr(getattr(worker, "wsgi", None), "extensions", {}).get(EXTENSION)
    if state is not None:
        state.queue.close()


def post_fork(server: Any, worker: Any) -> None:
    """Make psycopg2 cooperative in this worker (see the module docstring)."""
    from psycogreen.gevent import patch_psycopg

    patch_psycopg()


def post_worker_init(worker: Any) -> None:
    """Spec: objective resume at startup runs in every process role, the API's included.

    Each worker also watches its database and broker (one log line per outage): built here, after
    gevent patched the worker, so its locks and thread are gevent's.
    """
    from api.resume import start_api_resume

    outages.install(Settings.from_env())
    start_api_resume()
    _drain_on_stop(worker)


def _drain_on_stop(worker: Any) -> None:
    """When the arbiter tells this worker to stop (SIGTERM: ``alive`` turns false), end every open
    event stream with a ``retry:`` at once, instead of holding the graceful timeout and then being
    cut: the client reconnects to the next process from ``Last-Event-ID``."""
    import gevent

    from api.context import EXTENSION

    def watch() -> None:
        while worker.alive:
            gevent.sleep(DRAIN_WATCH_S)
        st = getattr(getattr(worker, "wsgi", None), "extensions", {}).get(EXTENSION)
        if st is not None:
            told = st.poller.drain()
            logging.getLogger("receipt.api").info("draining: %d event streams told to reconnect", told)

    gevent.spawn(watch)


# gunicorn >= 25.1 opens a control socket at one fixed per-user path ($HOME/.gunicorn/gunicorn.ctl),
# so two web processes on one machine (receipt up beside tests, or two apps) would share it. The
# platform (PaaS or `receipt up`) manages the process; the runtime control socket is not needed.
control_socket_disable = True
