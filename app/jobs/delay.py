"""Delayed jobs: when an enqueue asks to start later (``runAt`` or ``delayMs``), the job is ``queued``
with ``availableAt`` set, and nothing delivers it before that time (database clock).

Pure: the request is checked without a clock (``parse_run_at``, ``check_delay_ms``); the time the job
becomes available is decided with the database clock passed in (``available_at``).

**The past-due contract.** A ``runAt`` already in the past is accepted, and the job is available at
once (its ``availableAt`` is clamped to the enqueue's database time). Refusing it would turn two
ordinary things into errors: a client whose clock runs a little fast, and a request retried (or held
in a client-side queue) past the time it named. Celery's ``eta``, Oban's ``scheduled_at`` and River's
``ScheduledAt`` all run a past time at once too. ``delayMs`` is bounded (0 .. ``MAX_DELAY_MS``, 366
days); a ``runAt`` is any RFC 3339 time with its offset (an instant, whatever the host's zone).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any, Final

from app.jobs.errors import ValidationError

RUN_AT_FIELD: Final = "runAt"
DELAY_MS_FIELD: Final = "delayMs"
# The job.enqueued body field (and the job's JSON field) holding the time it becomes deliverable.
AVAILABLE_AT_FIELD: Final = "availableAt"
# The longest a job may wait: a year and a day (a yearly job enqueued early, plus slack).
MAX_DELAY_MS: Final = 366 * 24 * 3600 * 1000
# RFC 3339 text is short; anything longer is not a time.
RUN_AT_MAX_CHARS: Final = 64
_FIRST: Final = datetime.min.replace(tzinfo=UTC)
_LAST: Final = datetime.max.replace(tzinfo=UTC)
RUN_AT_RULE: Final = (
    "must be an RFC 3339 date-time with a UTC offset, e.g. 2026-05-01T09:00:00Z or 2026-05-01T09:00:00+02:00"
)


def parse_run_at(value: Any, field: str = RUN_AT_FIELD) -> datetime:
    """An RFC 3339 date-time with its offset (``Z`` or ``±hh:mm``), as an aware UTC datetime."""
    if not isinstance(value, str) or not value.strip() or len(value) > RUN_AT_MAX_CHARS:
        raise ValidationError(field, RUN_AT_RULE)
    text = value.strip()
    # RFC 3339 separates date and time with 'T' (or 't', or a space); a bare date is not a time.
    if len(text) < 16 or text[10] not in "Tt ":
        raise ValidationError(field, RUN_AT_RULE)
    try:
        parsed = datetime.fromisoformat(text[:-1] + "+00:00" if text[-1] in "zZ" else text)
    except ValueError:
        raise ValidationError(field, RUN_AT_RULE) from None
    if parsed.tzinfo is None:
        # A time without an offset means a different instant on every host: refuse it.
        raise ValidationError(field, RUN_AT_RULE + " (this one has no offset)")
    try:
        return parsed.astimezone(UTC)
    except OverflowError:
        # A valid RFC 3339 time whose UTC instant falls outside years 1..9999 (0001-01-01T00:00+01:00,
        # 9999-12-31T23:59-05:00): the nearest representable instant means the same thing here.
        return _FIRST if parsed.year == 1 else _LAST


def check_delay_ms(value: Any, field: str = DELAY_MS_FIELD) -> int:
    """``delayMs``: an integer number of milliseconds, 0 .. ``MAX_DELAY_MS``."""
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON's 5000.0 is the integer 5000 (JSON Schema says so too)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValidationError(field, f"must be an integer number of milliseconds, 0..{MAX_DELAY_MS}")
    if not 0 <= value <= MAX_DELAY_MS:
        raise ValidationError(field, f"must be between 0 and {MAX_DELAY_MS} milliseconds (366 days)")
    return value


def available_at(now: datetime, run_at: datetime | None, delay_ms: int | None) -> datetime | None:
    """When a job enqueued at ``now`` (database clock) may first be delivered; None: at once.

    A past ``runAt`` is clamped to the enqueue's own time (see the module doc).
    """
    if delay_ms is not None:
        return now + timedelta(milliseconds=delay_ms) if delay_ms > 0 else None
    if run_at is None:
        return None
    return max(run_at, now)
