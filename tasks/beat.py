"""Entry point of the scheduler: ``python -m tasks.beat`` (celery beat for the recovery loops)."""

from __future__ import annotations

import logging
import sys

from app.config import Settings
from app.factory import watchdog
from app.ops import logs, outages, preflight
from app.storage.files import private_dir
from tasks.celery_app import make_celery

log = logging.getLogger("receipt.beat")


def main(argv: list[str] | None = None) -> None:
    settings = Settings.from_env()
    logs.configure(settings, "beat")
    if watchdog.enabled(settings):
        try:
            watchdog.cron_expression(settings)
        except watchdog.CronError as exc:
            # An invalid schedule is a deployment error: refuse to start rather than never run it.
            log.error("%s", exc)
            raise SystemExit(f"beat: {exc}") from None
    # Beat publishes to the broker and claims loops in the database: both must work before it ticks.
    preflight.require(settings, database=preflight.Schema.HEAD, broker=True, log=log)
    outages.install(settings)
    private_dir(settings.home_path)
    app = make_celery(settings)
    app.start([*logs.quiet_banner_args(settings), "beat", "--loglevel", "INFO", *(argv or [])])


if __name__ == "__main__":
    main(sys.argv[1:])
