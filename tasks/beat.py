"""Entry point of the scheduler: ``python -m tasks.beat`` (celery beat for the recovery loops)."""

from __future__ import annotations

import logging
import sys

from app.config import Settings
from app.storage.files import private_dir
from tasks.celery_app import make_celery


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = Settings.from_env()
    private_dir(settings.home_path)
    app = make_celery(settings)
    app.start(["beat", "--loglevel", "INFO", *(argv or [])])


if __name__ == "__main__":
    main(sys.argv[1:])
