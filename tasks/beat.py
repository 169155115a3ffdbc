"""Entry point of the scheduler: ``python -m tasks.beat`` (celery beat for the recovery loops)."""

from __future__ import annotations

import logging
import sys

from app.config import Settings
from app.factory import watchdog
from app.ops import logs
from app.storage.files import private_dir
from tasks.celery_app import make_celery


def main(argv: list[str] | None = None) -> None:
    settings = Settings.from_env()
    logs.configure(settings, "beat")
    if watchdog.enabled(settings):
        try:
            watchdog.cron_expression(settings)
        except watchdog.CronError as exc:
            # An invalid schedule is a deployment error: refuse to start rather than never run it.
            logging.getLogger("receipt.beat").error("%s", exc)
            raise SystemExit(f"beat: {exc}") from None
    private_dir(settings.home_path)
    app = make_celery(settings)
    app.start([*logs.quiet_banner_args(settings), "beat", "--loglevel", "INFO", *(argv or [])])


if __name__ == "__main__":
    main(sys.argv[1:])
