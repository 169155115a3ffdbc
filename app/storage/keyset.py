"""The one keyset pager of every newest-first list (jobs, objectives, schedules): its cursor, the
query from a cursor's position, and a page's rows with the cursor after them."""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import and_, or_
from sqlalchemy.sql import Select

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


R = TypeVar("R")


def newest_first(q: Select[Any], created: Any, key: Any, cursor: str | None, limit: int) -> Select[Any]:
    """``q`` from the position after ``cursor`` (None: the start), newest first by ``created`` then
    ``key``, one row more than ``limit``: that row says whether a next page exists (``page``)."""
    if cursor:
        at, last = decode_cursor(cursor)
        q = q.where(or_(created < at, and_(created == at, key < last)))
    return q.order_by(created.desc(), key.desc()).limit(limit + 1)


def page(rows: Sequence[R], limit: int) -> tuple[Sequence[R], str | None]:
    """``newest_first``'s rows (each with ``created_at`` and ``id``) as a page of ``limit`` and the
    cursor after its last row (None: this page is the last)."""
    if len(rows) <= limit:
        return rows, None
    last: Any = rows[limit - 1]
    return rows[:limit], encode_cursor(as_utc(last.created_at), last.id)
