"""The schedules' vocabularies, each defined once: statuses, overlap policies, receipt types, reasons,
the stream name, the tick's text and the id a tick's job gets."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Final, Literal, get_args

from app.jobs.ids import qualify

ScheduleStatus = Literal["active", "paused", "deleted"]
SCHEDULE_STATUSES: Final[tuple[str, ...]] = get_args(ScheduleStatus)

# What a tick does while the schedule's previous job is still active (queued, leased or running):
# allow: fire anyway; skip: record the tick skipped; bufferOne: keep one tick, fired as soon as the
# previous job ends (a second one is skipped); cancelPrevious: cancel the previous job, then fire.
Overlap = Literal["allow", "skip", "bufferOne", "cancelPrevious"]
OVERLAPS: Final[tuple[str, ...]] = get_args(Overlap)
DEFAULT_OVERLAP: Final[Overlap] = "skip"

EventType = Literal[
    "schedule.created",
    "schedule.updated",
    "schedule.paused",
    "schedule.resumed",
    "schedule.deleted",
    "schedule.fired",
    "schedule.missed",
    "schedule.skipped",
    "schedule.buffered",
    "schedule.withdrawn",
]
EVENT_TYPES: Final[tuple[str, ...]] = get_args(EventType)
# The receipts that record what became of ticks (the fires listing reads these).
TICK_EVENTS: Final[tuple[str, ...]] = (
    "schedule.fired",
    "schedule.missed",
    "schedule.skipped",
    "schedule.buffered",
    "schedule.withdrawn",
)

# Why a tick fired: its own time came (on time, or late after downtime: the receipt's ``lateMs``
# says by how much), a buffered tick was released, an operator's trigger, a backfill.
FireTrigger = Literal["schedule", "buffered", "trigger", "backfill"]
FIRE_TRIGGERS: Final[tuple[str, ...]] = get_args(FireTrigger)
# overlap: the previous job is still active (skip; or bufferOne, a trigger); buffer_full: bufferOne
# already holds a tick; superseded: cancelPrevious with several ticks due at once fires the latest.
SkipReason = Literal["overlap", "buffer_full", "superseded"]
SKIP_REASONS: Final[tuple[str, ...]] = get_args(SkipReason)
MissReason = Literal["outside_catchup_window"]
MISS_REASONS: Final[tuple[str, ...]] = get_args(MissReason)
# Why a tick decided ahead of its time was taken back before it came (its waiting job canceled, the
# tick decided again under the schedule as it then is): the schedule was paused, changed or deleted.
WithdrawReason = Literal["paused", "updated", "deleted"]
WITHDRAW_REASONS: Final[tuple[str, ...]] = get_args(WithdrawReason)

# Where a schedule was declared: the API, or the schedules file loaded at startup.
Source = Literal["api", "file"]
SOURCES: Final[tuple[str, ...]] = get_args(Source)

# -- bounds -------------------------------------------------------------------------------------
# Temporal's floor: a window shorter than a few passes would call ordinary lateness a miss.
CATCHUP_WINDOW_MIN_MS: Final = 10_000
CATCHUP_WINDOW_DEFAULT_MS: Final = 60_000
CATCHUP_WINDOW_MAX_MS: Final = 366 * 24 * 3600 * 1000
JITTER_MAX_MS: Final = 24 * 3600 * 1000
INTERVAL_MIN_MS: Final = 1000
INTERVAL_MAX_MS: Final = 366 * 24 * 3600 * 1000
# Ticks one pass fires for one schedule at most; the rest are the next pass's (a catch-up after a
# long outage of a per-second schedule must not become one giant transaction).
FIRES_PER_PASS_MAX: Final = 1000
# Missed ticks a pass counts one by one before it jumps to the catch-up window's start.
MISSED_COUNT_MAX: Final = 10_000
# Missed ticks listed in a ``schedule.missed`` receipt (all of them are counted).
MISSED_LISTED_MAX: Final = 100
BACKFILL_TICKS_MAX: Final = 1000

# A schedule id is part of its fires' job ids (``<scheduleId>:<tick>``, at most 128 characters), so
# it is shorter than a job id, and it holds no ':' (so a fire id always splits at its last ':').
SCHEDULE_ID_PATTERN: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
SCHEDULE_ID_RULE: Final = (
    "must be 1-100 characters of letters, digits, '.', '_' or '-', starting with a letter or digit"
)

SCHEDULE_STREAM_PREFIX: Final = "schedules/"
TICK_SEPARATOR: Final = ":"


def schedule_stream(key: str) -> str:
    """The stream a schedule's receipts live on: ``schedules/<organizationId>/<scheduleId>``."""
    return f"{SCHEDULE_STREAM_PREFIX}{key}"


def schedule_key_of(stream: str) -> str:
    return stream[len(SCHEDULE_STREAM_PREFIX) :] if stream.startswith(SCHEDULE_STREAM_PREFIX) else stream


def tick_text(tick: datetime) -> str:
    """A tick as a fire's job id names it: UTC, ``20260501T090000Z`` (milliseconds only when it has
    them: ``20260501T090000.250Z``, a trigger's)."""
    at = tick.astimezone(UTC)
    text = at.strftime("%Y%m%dT%H%M%S")
    ms = at.microsecond // 1000
    return f"{text}.{ms:03d}Z" if ms else f"{text}Z"


def fire_client_id(schedule_id: str, tick: datetime, revision: int | None = None) -> str:
    """The job id of a schedule's tick, ``<scheduleId>:<tick>``: the same tick is always the same job,
    so two beats, a retried pass or a repeated backfill enqueue it once. A tick decided ahead, then
    withdrawn and decided again, is ``<scheduleId>:<tick>-<revision>`` (the withdrawal's stream seq):
    its first job is canceled and keeps its id."""
    base = f"{schedule_id}{TICK_SEPARATOR}{tick_text(tick)}"
    return base if revision is None else f"{base}-{revision}"


def fire_job_key(organization_id: str, schedule_id: str, tick: datetime, revision: int | None = None) -> str:
    """The storage key of a tick's job, in the schedule's organisation."""
    return qualify(organization_id, fire_client_id(schedule_id, tick, revision))
