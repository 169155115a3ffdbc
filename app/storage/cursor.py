"""The keyset cursor every newest-first list pages with (jobs, objectives, schedules)."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from app.jobs.errors import ValidationError
from app.jobs.ids import JOB_ID_PATTERN, KEY_SEPARATOR, ORGANIZATION_ID_PATTERN, SYSTEM_ORGANIZATION
from app.storage.db import as_utc

# A list cursor is the keyset position after a page: ``<createdAt in µs since the epoch>.<job key>``.
# Every string of this shape is a position the server can resume from, and nothing else is, so
# the OpenAPI document can state the rule exactly (api.schemas uses this pattern). 17 digits reach
# past the year 5000; job ids follow their own pattern (app.jobs.ids).
# The job part is its storage key: an organisation (or the system's own) and '/', or a bare key.
_KEY_ORGANIZATION = "(?:" + re.escape(SYSTEM_ORGANIZATION) + "|" + ORGANIZATION_ID_PATTERN.pattern[1:-1] + ")"
CURSOR_PATTERN = (
    r"^([0-9]{1,17})\.((?:" + _KEY_ORGANIZATION + KEY_SEPARATOR + ")?" + JOB_ID_PATTERN.pattern[1:-1] + r")$"
)
_CURSOR = re.compile(CURSOR_PATTERN)
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MICROSECOND = timedelta(microseconds=1)


def encode_cursor(created: datetime, job_id: str) -> str:
    return f"{(as_utc(created) - _EPOCH) // _MICROSECOND}.{job_id}"


def decode_cursor(cursor: str) -> tuple[datetime, str]:
    match = _CURSOR.fullmatch(cursor)
    if match is None:
        raise ValidationError("cursor", "is not a cursor this server issued")
    return _EPOCH + int(match.group(1)) * _MICROSECOND, match.group(2)
