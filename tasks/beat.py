"""Entry point of the scheduler: ``python -m tasks.beat`` (celery beat for the recovery loops).

Its schedule is the loop registry's (``app/ops/loops.py``): every active loop, at its interval or cron.
"""

from __future__ import annotations

import logging
import sys

from app.config import Settings
from app.ops import logs
from app.ops import loops as registry
from app.storage.files import private_dir
from tasks.celery_app import make_celery


def main(argv: list[str] | None = None) -> None:
    settings = Settings.from_env()
    logs.configure(settings, "beat")
    errors = registry.schedule_errors(settings)
    if errors:
        # An invalid schedule is a deployment error: refuse to start rather than never run it.
        for error in errors:
            logging.getLogger("receipt.beat").error("%s", error)
        raise SystemExit(f"beat: {'; '.join(errors)}")
    private_dir(settings.home_path)
    app = make_celery(settings)
    app.start([*logs.quiet_banner_args(settings), "beat", "--loglevel", "INFO", *(argv or [])])


if __name__ == "__main__":
    main(sys.argv[1:])
