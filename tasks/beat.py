"""Entry point of the scheduler: ``python -m tasks.beat`` (celery beat for the recovery loops)."""

from __future__ import annotations

import sys

from app.config import Settings
from app.ops import logs
from app.storage.files import private_dir
from tasks.celery_app import make_celery


def main(argv: list[str] | None = None) -> None:
    settings = Settings.from_env()
    logs.configure(settings, "beat")
    private_dir(settings.home_path)
    app = make_celery(settings)
    app.start([*logs.quiet_banner_args(settings), "beat", "--loglevel", "INFO", *(argv or [])])


if __name__ == "__main__":
    main(sys.argv[1:])
