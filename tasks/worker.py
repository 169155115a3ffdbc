"""Entry point of a worker process: ``python -m tasks.worker [--role ROLE]``.

The role (flag, else ``RECEIPT_PROCESS_ROLE``) decides the queues consumed and the concurrency.
An unknown role runs as ``all`` (maintenance only) after a loud warning naming the valid roles.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings

from celery.exceptions import SecurityWarning

import celeryconfig
from app import tracing
from app.config import Settings
from app.jobs.routing import DRIVER_QUEUE, QUEUES
from app.ops import logs, metrics, outages, preflight
from tasks.celery_app import make_celery
from workers import sandbox
from workers.roles import concurrency, resolve_role, unknown_role_warning

log = logging.getLogger("receipt.worker")


def worker_argv(settings: Settings, raw_role: str | None) -> list[str]:
    """The ``celery worker`` arguments for a role (pure: tested without starting anything)."""
    role, _ = resolve_role(raw_role)
    if role.name == "api":
        raise SystemExit("role 'api' serves HTTP and consumes no queue: run gunicorn (Procfile 'web')")
    return [
        *logs.quiet_banner_args(settings),
        "worker",
        "--queues",
        ",".join(role.queues),
        "--concurrency",
        str(concurrency(role, settings.execute_concurrency)),
        "--pool",
        "threads",
        "--hostname",
        f"{role.name}@%h",
        "--loglevel",
        "INFO",
        "--without-mingle",
        "--without-gossip",
    ]


def log_sandbox_protections(settings: Settings) -> list[str]:
    """A codex worker says once, at start, which command protections this host lacks."""
    try:
        config = sandbox.SandboxConfig.from_settings(settings)
    except ValueError as exc:
        log.error("codex sandbox misconfigured: %s (every command will fail until it is fixed)", exc)
        return [str(exc)]
    off = sandbox.protections_off(config, sandbox.detect_host())
    if off:
        log.warning("codex sandbox: these protections are OFF on this host: %s", "; ".join(off))
    else:
        log.info(
            "codex sandbox: every protection is on (a user id per attempt from %s, a private "
            "filesystem view, PID, IPC and network namespaces)",
            config.uid_range,
        )
    return off


def silence_root_warning(settings: Settings) -> None:
    """Silence Celery's "running as root" SecurityWarning — knowingly, and only when it cannot apply.

    The warning exists because a root worker that accepts pickle executes whatever a broker
    client sends. Receipt's workers accept JSON only (``accept_content``; asserted here, so a
    change that adds pickle brings the warning, and Celery's own refusal to start, back).
    Containers and the sandbox run everything as root, where the warning is noise on every start.
    """
    accepted = celeryconfig.build(settings)["accept_content"]
    if accepted == ["json"]:
        warnings.filterwarnings("ignore", category=SecurityWarning)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tasks.worker")
    parser.add_argument("--role", help="overrides RECEIPT_PROCESS_ROLE")
    args = parser.parse_args(argv)
    settings = Settings.from_env()
    raw = args.role if args.role is not None else settings.process_role
    role, known = resolve_role(raw)
    logs.configure(settings, role.name)
    try:
        tracing.check()
    except ValueError as exc:
        raise SystemExit(f"tracing: {exc}") from None
    if role.name == "api":
        worker_argv(settings, raw)  # refuses, naming the process to run instead
    # A wrong DATABASE_URL or REDIS_URL stops here in one line, not in a traceback or a retry loop.
    preflight.require(settings, database=preflight.Schema.HEAD, broker=True, log=log)
    outages.install(settings)
    silence_root_warning(settings)
    # Only where asked (RECEIPT_WORKER_METRICS_PORT): workers on hosts the web cannot read from.
    metrics.start_worker_endpoint(settings.worker_metrics_port, settings.metrics_token)
    if not known:
        log.warning(unknown_role_warning(raw))
    if QUEUES["codex"] in role.queues:
        log_sandbox_protections(settings)
    app = make_celery(settings)
    # Every role recovers without beat the loops whose ticks go to a queue it consumes
    # (workers/loop_passes.py).
    app.receipt_ticker_queues = role.queues
    # The scanning role also blocks on the Redis wake list: enqueues then send no message.
    app.receipt_wake_listener = DRIVER_QUEUE in role.queues
    # Every worker process keeps a liveness record of its own (workers/liveness.py).
    app.receipt_liveness_role = role.name
    app.worker_main(worker_argv(settings, raw))


if __name__ == "__main__":
    main(sys.argv[1:])
