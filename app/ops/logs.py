"""Logging for every Receipt process (web, driver, worker groups, beat), configured in one place.

``RECEIPT_LOG_FORMAT=plain`` (default) writes one readable line per record; ``json`` writes one
JSON object per line (python-json-logger's formatter: a maintained library rather than a
hand-rolled ``json.dumps`` formatter, and it renders exceptions and ``extra=`` fields for us).

Every record carries the process ``role``. While a worker or driver handles a job it binds the
job's fields — ``jobId``, ``attempt``, ``fence``, ``workerId``, ``org`` — in a context variable
(``bind_job``); a filter copies them onto every record logged in that context, by any library,
so a job-related line is never missing them. With tracing on (``app.tracing``), a line logged
inside a span also carries its ``trace_id`` and ``span_id``. Threads start with an empty context, so code that
hands a job to a thread runs the thread inside ``contextvars.copy_context()``.

No secret setting is ever written: the one handler (``RedactingHandler``) runs the deployment's
``Redactor`` (every value marked secret in ``app/config.py``, every URL setting's password and
query string) over each formatted line, whatever library logged it.
"""

from __future__ import annotations

import contextvars
import logging
import logging.config
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Final, Literal, TextIO

from app import tracing
from app.config import Settings
from app.redaction import Redactor

LogFormat = Literal["plain", "json"]
LOG_FORMATS: Final[tuple[str, ...]] = ("plain", "json")
# The job fields a job-related line carries.
JOB_FIELDS: Final[tuple[str, ...]] = ("jobId", "attempt", "fence", "workerId", "org")

_job: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar("receipt_job", default=None)
_role = "unknown"

# Lines written on every tick of something periodic, so that an idle process is quiet at the
# default level unless RECEIPT_LOG_TICKS=enabled (``dict_config``): Receipt's loop passes (logged
# at DEBUG on this logger), and the libraries' loggers that write a line per tick or per task at
# INFO (beat's every send; a worker's received/succeeded pair, which ``receipt.execute``'s
# settlement line and the metrics already say), held at WARNING.
TICK_PASSES: Final = "receipt.loops.passes"
TICK_LOGGERS: Final[tuple[str, ...]] = ("celery.beat", "celery.worker.strategy", "celery.app.trace")

PLAIN_FORMAT = "%(asctime)s %(levelname)-7s %(role)s %(name)s: %(message)s%(job_suffix)s"
JSON_FIELDS = "%(asctime)s %(levelname)s %(name)s %(role)s %(message)s"


def log_format(settings: Settings) -> LogFormat:
    """The configured format (``Settings`` refuses anything but the two)."""
    return "json" if settings.log_format == "json" else "plain"


@contextmanager
def bind_job(**fields: Any) -> Iterator[None]:
    """Attach job fields to every record logged inside the block (nested binds add to the outer)."""
    current = dict(_job.get() or {})
    current.update({k: v for k, v in fields.items() if v is not None})
    token = _job.set(current)
    try:
        yield
    finally:
        _job.reset(token)


def set_job(**fields: Any) -> None:
    """Bind job fields for the rest of this thread's current task (``clear_job`` ends it).

    For frameworks that announce a task's start and end with signals (Celery's prerun/postrun)
    rather than wrapping it in a block; ``bind_job`` is the block form.
    """
    _job.set({k: v for k, v in fields.items() if v is not None})


def clear_job() -> None:
    _job.set(None)


def update_job(**fields: Any) -> None:
    """Add fields learnt later (the job's org, the lease holder) to the innermost ``bind_job``."""
    current = _job.get()
    if isinstance(current, dict):
        current.update({k: v for k, v in fields.items() if v is not None})


class ContextFilter(logging.Filter):
    """Copies the process role and the bound job fields onto each record."""

    def __init__(self, plain: bool = True) -> None:
        super().__init__()
        self.plain = plain

    def filter(self, record: logging.LogRecord) -> bool:
        record.role = _role
        # With tracing on, a line logged inside a span names it: trace_id and span_id, as
        # OpenTelemetry's log data model names them, so a log query and the trace UI meet.
        ids = tracing.current_ids() if tracing.on() else None
        if ids is not None:
            record.trace_id, record.span_id = ids
        fields = _job.get() or {}
        if fields:
            # Every job field on every job-related line, null when this step does not know it
            # (the driver has no lease holder), so a log query never misses a line for a key.
            for name in JOB_FIELDS:
                if not hasattr(record, name):
                    setattr(record, name, fields.get(name))
        if not self.plain:
            return True
        # The plain format shows the job briefly at the end: readable, and greppable by job id.
        shown = " ".join(f"{k}={fields[k]}" for k in ("jobId", "attempt") if k in fields)
        if ids is not None:
            shown = f"{shown} trace_id={ids[0]}".lstrip()
        record.job_suffix = f" [{shown}]" if shown else ""
        return True


class RedactingHandler(logging.StreamHandler[TextIO]):
    """The one handler of every process: each line is written with every secret of the
    deployment's settings replaced by ``***``.

    It hides the formatted line, whoever logged it and whatever part of the record held the
    secret (message, arguments, traceback, stack, ``extra=`` fields); the secret texts include
    their JSON and ``repr`` escapes, so a JSON line or a logged list hides them too.
    """

    def __init__(self, stream: TextIO | None = None, redactor: Redactor | None = None) -> None:
        super().__init__(stream)
        self.redactor = redactor or Redactor()

    def format(self, record: logging.LogRecord) -> str:
        return self.redactor(super().format(record))

    def handleError(self, record: logging.LogRecord) -> None:
        # logging's own report of a record it could not format prints its message and arguments.
        record.msg, record.args = self.redactor(f"{record.msg!r} % {record.args!r}"), None
        super().handleError(record)


def dict_config(settings: Settings, role: str) -> dict[str, Any]:
    """A ``logging.config.dictConfig`` mapping: one stderr handler on the root logger.

    gunicorn takes the same mapping as its ``logconfig_dict``, so its own lines share the format.
    """
    global _role
    _role = role
    # The same name is the process's service.name in its traces (receipt-<role>).
    tracing.set_role(role)
    level = settings.log_level.strip().upper() or "INFO"
    if log_format(settings) == "json":
        formatter: dict[str, Any] = {
            "()": "pythonjsonlogger.json.JsonFormatter",
            "fmt": JSON_FIELDS,
            "rename_fields": {"asctime": "time", "levelname": "level", "name": "logger"},
        }
    else:
        formatter = {"format": PLAIN_FORMAT}
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {
            "context": {"()": ContextFilter, "plain": log_format(settings) == "plain"},
            # One line per outage of the database or broker, not one per retry (app/ops/outages.py).
            "outages": {"()": "app.ops.outages.OutageFilter"},
        },
        "formatters": {"receipt": formatter},
        "handlers": {
            "stderr": {
                "()": RedactingHandler,
                "stream": "ext://sys.stderr",
                "redactor": Redactor.of(settings),
                "formatter": "receipt",
                "filters": ["context", "outages"],
            }
        },
        "root": {"level": level, "handlers": ["stderr"]},
        "loggers": {
            # gunicorn attaches its own handlers unless told to propagate to ours.
            "gunicorn.error": {"level": level, "handlers": [], "propagate": True},
            "gunicorn.access": {"level": level, "handlers": [], "propagate": True},
            **tick_loggers(settings, level),
        },
    }


def tick_loggers(settings: Settings, level: str) -> dict[str, Any]:
    """The levels of the per-tick loggers (``TICK_PASSES``, ``TICK_LOGGERS``): shown with
    RECEIPT_LOG_TICKS=enabled or at DEBUG, held back otherwise."""
    shown = {name: {"level": level} for name in TICK_LOGGERS}
    if settings.log_ticks:
        return {**shown, TICK_PASSES: {"level": "DEBUG"}}
    numeric = logging.getLevelName(level)
    if isinstance(numeric, int) and numeric <= logging.DEBUG:
        return {**shown, TICK_PASSES: {"level": level}}
    held = level if isinstance(numeric, int) and numeric > logging.WARNING else "WARNING"
    return {**{name: {"level": held} for name in TICK_LOGGERS}, TICK_PASSES: {"level": "NOTSET"}}


def quiet_banner_args(settings: Settings) -> list[str]:
    """Celery's global ``--quiet`` in JSON mode: its start-up banner is printed, not logged, and
    would be the only non-JSON lines in the stream. The plain format keeps it (it says what runs)."""
    return ["--quiet"] if log_format(settings) == "json" else []


def configure(settings: Settings, role: str) -> None:
    """Configure logging for this process (web, a worker role or beat)."""
    logging.config.dictConfig(dict_config(settings, role))
    logging.captureWarnings(True)
