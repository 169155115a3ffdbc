"""Entry point of a worker process: ``python -m tasks.worker [--role ROLE]``.

The role (flag, else ``RECEIPT_PROCESS_ROLE``) decides the queues consumed and the concurrency.
An unknown role runs as ``all`` (maintenance only) after a loud warning naming the valid roles.
"""

from __future__ import annotations

import argparse
import logging
import sys

from app.config import Settings
from app.jobs.routing import MAINTENANCE_QUEUE
from tasks.celery_app import make_celery
from workers.roles import concurrency, resolve_role, unknown_role_warning

log = logging.getLogger("receipt.worker")


def worker_argv(settings: Settings, raw_role: str | None) -> list[str]:
    """The ``celery worker`` arguments for a role (pure: tested without starting anything)."""
    role, _ = resolve_role(raw_role)
    if role.name == "api":
        raise SystemExit("role 'api' serves HTTP and consumes no queue: run gunicorn (Procfile 'web')")
    return [
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m tasks.worker")
    parser.add_argument("--role", help="overrides RECEIPT_PROCESS_ROLE")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings.from_env()
    raw = args.role if args.role is not None else settings.process_role
    _role, known = resolve_role(raw)
    if not known:
        log.warning(unknown_role_warning(raw))
    app = make_celery(settings)
    # Every role that consumes maintenance work also recovers without beat (tasks/loops.py).
    app.receipt_local_ticker = MAINTENANCE_QUEUE in _role.queues
    app.worker_main(worker_argv(settings, raw))


if __name__ == "__main__":
    main(sys.argv[1:])
