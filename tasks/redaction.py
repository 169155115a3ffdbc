"""Celery never logs a task's arguments or its return value.

Celery's worker writes ``Task … succeeded in …s: <return value>`` and carries the arguments on
received/failed log records and on task events (which Flower shows). Receipt's task arguments and
results are job ids and delivery outcomes today, but the rule is that none of it reaches a log:

- ``before_task_publish`` replaces ``argsrepr``/``kwargsrepr`` in every message Receipt sends,
  so the worker's own records and task events show ``<redacted>`` (the arguments themselves
  travel unchanged);
- a logging filter on Celery's trace and worker loggers replaces ``return_value``, ``args`` and
  ``kwargs`` in every record, whoever sent the task.
"""

from __future__ import annotations

import logging
from typing import Any

from celery import signals

REDACTED = "<redacted>"
_FIELDS = ("return_value", "args", "kwargs")
LOGGERS = ("celery.app.trace", "celery.worker.strategy", "celery.worker.request", "celery.worker.job")


class RedactTaskData(logging.Filter):
    """Blank a task record's return value and arguments, in its message and its ``data`` extra."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, dict):
            record.args = {k: (REDACTED if k in _FIELDS else v) for k, v in record.args.items()}
        data = getattr(record, "data", None)
        if isinstance(data, dict):
            record.data = {k: (REDACTED if k in _FIELDS else v) for k, v in data.items()}
        return True


_FILTER = RedactTaskData()


def install() -> None:
    """Idempotent: attach the filter to Celery's loggers and the publish hook (once per process)."""
    for name in LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
    signals.before_task_publish.connect(_redact_headers, weak=False, dispatch_uid="receipt-redact-args")


def _redact_headers(headers: dict[str, Any] | None = None, **_: Any) -> None:
    if headers is not None:
        headers["argsrepr"] = REDACTED
        headers["kwargsrepr"] = REDACTED
