"""celery beat for the recovery loops, with Receipt's start-up: ``celery -A tasks.celery_app beat``.

The app ``tasks.celery_app`` builds runs beat as ``ReceiptBeat``, so the plain celery command (the
Procfile's ``beat`` line) and ``python -m tasks.beat`` (``receipt up``, the test harness) start the
same way:

- Receipt's logging, as every process has it (plain or JSON, with the secret filter); in JSON mode
  Celery's banner is not printed, since it would be the only non-JSON lines in the stream;
- a refusal to start on an invalid schedule (the loop registry's, ``app/ops/loop_registry.py``), naming
  the variable (a schedule that never runs is a deployment error);
- the home directory, private, before beat opens its schedule file there.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

from celery.apps.beat import Beat

from app.config import Settings
from app.ops import logs, loop_registry, outages, preflight
from app.schedules import declared
from app.storage.files import private_dir

log = logging.getLogger("receipt.beat")


def prepare(settings: Settings) -> None:
    """Beat's start-up: logging, the loops' schedules and the schedules file checked (SystemExit when
    invalid), the database and the broker (one line and exit 2 when either is unusable), the outage
    watch, the home folder."""
    logs.configure(settings, "beat")
    errors = loop_registry.schedule_errors(settings)
    if errors:
        # An invalid schedule is a deployment error: refuse to start rather than never run it.
        for error in errors:
            log.error("%s", error)
        raise SystemExit(f"beat: {'; '.join(errors)}")
    if settings.schedules_file:
        # A schedules file that cannot be loaded is a deployment error too: say so before running.
        try:
            declared.load(settings.schedules_file)
        except declared.ScheduleFileError as exc:
            log.error("%s", exc)
            raise SystemExit(f"beat: RECEIPT_SCHEDULES_FILE: {exc}") from None
    # Beat publishes to the broker and claims loops in the database: both must work before it ticks.
    preflight.require(settings, database=preflight.Schema.HEAD, broker=True, log=log)
    outages.install(settings)
    private_dir(settings.home_path)


class ReceiptBeat(Beat):  # type: ignore[misc] # Celery ships no type information
    """``celery beat`` preceded by ``prepare`` (the app's ``Beat``, set by ``make_celery``)."""

    def __init__(self, *args: Any, quiet: bool = False, **kwargs: Any) -> None:
        settings: Settings = self.app.receipt_settings
        super().__init__(*args, quiet=quiet or bool(logs.quiet_banner_args(settings)), **kwargs)

    def run(self) -> None:
        prepare(self.app.receipt_settings)
        super().run()


log = logging.getLogger("receipt.beat")


def main(argv: list[str] | None = None) -> None:
    """``python -m tasks.beat [args]``: exactly ``celery -A tasks.celery_app beat --loglevel INFO [args]``."""
    from celery.bin.celery import celery

    command = ["-A", "tasks.celery_app", "beat", "--loglevel", "INFO", *(argv or [])]
    celery.main(args=command, prog_name="celery", auto_envvar_prefix="CELERY")


if __name__ == "__main__":
    main(sys.argv[1:])
