"""Entry point of the scheduler: ``python -m tasks.beat`` (celery beat for the recovery loops)."""

from __future__ import annotations

import logging
import sys

from app.config import Settings
from app.factory import watchdog
from tasks.celery_app import make_celery


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings.from_env()
    if watchdog.enabled(settings):
        try:
            watchdog.cron_expression(settings)
        except watchdog.CronError as exc:
            # An invalid schedule is a deployment error: refuse to start rather than never run it.
            logging.getLogger("receipt.beat").error("%s", exc)
            raise SystemExit(f"beat: {exc}") from None
    settings.home_path.mkdir(parents=True, exist_ok=True)
    app = make_celery(settings)
    app.start(["beat", "--loglevel", "INFO", *(argv or [])])


if __name__ == "__main__":
    main(sys.argv[1:])
