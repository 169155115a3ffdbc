"""A job's flow fields: what the dispatch pass weighs beside its organisation (docs/dispatch.md).

``priority`` orders a job inside its organisation's line; ``concurrencyKey`` (with an optional
``concurrencyLimit``) bounds how many attempts sharing the key run at once; ``debounce`` lets a later
enqueue with the same key replace a pending one. All are optional: a job without them is dispatched
as the contract says, oldest first. They are kept in ``job.enqueued`` under these names, each only
when set, so a receipt written without them folds to the defaults.

Keys are scoped to the job's organisation: two organisations using one key never share a limit.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from app.jobs.errors import ValidationError

PRIORITY_FIELD: Final = "priority"
CONCURRENCY_KEY_FIELD: Final = "concurrencyKey"
CONCURRENCY_LIMIT_FIELD: Final = "concurrencyLimit"
DEBOUNCE_FIELD: Final = "debounce"
FLOW_FIELDS: Final = (PRIORITY_FIELD, CONCURRENCY_KEY_FIELD, CONCURRENCY_LIMIT_FIELD, DEBOUNCE_FIELD)

# Higher runs first, inside the organisation's share; 0 is the contract's plain FIFO.
PRIORITY_MIN: Final = -10
PRIORITY_MAX: Final = 10
PRIORITY_DEFAULT: Final = 0
PRIORITY_RULE: Final = f"must be an integer from {PRIORITY_MIN} (runs last) to {PRIORITY_MAX} (runs first)"

KEY_MAX: Final = 128
KEY_PATTERN: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")
KEY_RULE: Final = (
    f"must be 1-{KEY_MAX} characters of letters, digits, '.', '_', ':', '/' or '-', starting with a "
    "letter or digit"
)

CONCURRENCY_LIMIT_MIN: Final = 1
CONCURRENCY_LIMIT_MAX: Final = 1000
CONCURRENCY_LIMIT_RULE: Final = f"must be an integer from {CONCURRENCY_LIMIT_MIN} to {CONCURRENCY_LIMIT_MAX}"
# A key whose limit neither the job nor the operator gives (the operator removed its prefix while
# the job waited) runs one at a time: the bound that protects whatever the key guards.
FALLBACK_CONCURRENCY_LIMIT: Final = 1

DEBOUNCE_WINDOW_MIN_MS: Final = 1
DEBOUNCE_WINDOW_MAX_MS: Final = 86_400_000
DEBOUNCE_WINDOW_RULE: Final = (
    f"must be an integer number of milliseconds from {DEBOUNCE_WINDOW_MIN_MS} to {DEBOUNCE_WINDOW_MAX_MS}"
)
DEBOUNCE_FIELDS: Final = ("key", "windowMs")
DEBOUNCE_WITH_DELAY_RULE: Final = (
    "cannot be combined with runAt or delayMs: the window decides when the job runs"
)
LIMIT_NEEDS_KEY_RULE: Final = f"needs a {CONCURRENCY_KEY_FIELD}"
# The reason on the ``job.canceled`` of a pending job a later debounced enqueue replaced; the receipt
# also names that job (``replacedBy``), so the burst can be followed from either end.
DEBOUNCED_REASON: Final = "debounced"
REPLACED_BY_FIELD: Final = "replacedBy"


@dataclass(frozen=True)
class Debounce:
    key: str
    window_ms: int


@dataclass(frozen=True)
class Flow:
    """A job's flow fields, defaults applied (``Flow()``: none given)."""

    priority: int = PRIORITY_DEFAULT
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    debounce: Debounce | None = None

    @property
    def plain(self) -> bool:
        return self == PLAIN

    def to_body(self) -> dict[str, Any]:
        """The fields ``job.enqueued`` carries: only those set."""
        body: dict[str, Any] = {}
        if self.priority != PRIORITY_DEFAULT:
            body[PRIORITY_FIELD] = self.priority
        if self.concurrency_key is not None:
            body[CONCURRENCY_KEY_FIELD] = self.concurrency_key
        if self.concurrency_limit is not None:
            body[CONCURRENCY_LIMIT_FIELD] = self.concurrency_limit
        if self.debounce is not None:
            body[DEBOUNCE_FIELD] = {"key": self.debounce.key, "windowMs": self.debounce.window_ms}
        return body


PLAIN: Final = Flow()


def _int(raw: Any, field: str, low: int, high: int, rule: str) -> int:
    if isinstance(raw, float) and raw.is_integer():
        raw = int(raw)  # JSON's 5.0 is the integer 5 (JSON Schema says so too)
    if isinstance(raw, bool) or not isinstance(raw, int) or not low <= raw <= high:
        raise ValidationError(field, rule)
    return raw


def _key(raw: Any, field: str) -> str:
    if not isinstance(raw, str) or not KEY_PATTERN.fullmatch(raw):
        raise ValidationError(field, KEY_RULE)
    return raw


def validate_flow(body: Mapping[str, Any], prefix: str = "") -> Flow:
    """The flow fields of an enqueue body (``PLAIN`` when it names none), or a ``ValidationError``
    naming the field (under ``prefix``, e.g. ``items[3].``) and what it allows."""
    if not any(body.get(name) is not None for name in FLOW_FIELDS):
        return PLAIN
    priority = body.get(PRIORITY_FIELD)
    priority = (
        PRIORITY_DEFAULT
        if priority is None
        else _int(priority, prefix + PRIORITY_FIELD, PRIORITY_MIN, PRIORITY_MAX, PRIORITY_RULE)
    )
    key = body.get(CONCURRENCY_KEY_FIELD)
    key = None if key is None else _key(key, prefix + CONCURRENCY_KEY_FIELD)
    limit = body.get(CONCURRENCY_LIMIT_FIELD)
    if limit is not None:
        limit = _int(
            limit,
            prefix + CONCURRENCY_LIMIT_FIELD,
            CONCURRENCY_LIMIT_MIN,
            CONCURRENCY_LIMIT_MAX,
            CONCURRENCY_LIMIT_RULE,
        )
        if key is None:
            raise ValidationError(prefix + CONCURRENCY_LIMIT_FIELD, LIMIT_NEEDS_KEY_RULE)
    return Flow(priority, key, limit, _debounce(body.get(DEBOUNCE_FIELD), prefix + DEBOUNCE_FIELD))


def _debounce(raw: Any, field: str) -> Debounce | None:
    if raw is None:
        return None
    if not isinstance(raw, Mapping):
        raise ValidationError(field, "must be an object with key and windowMs")
    unknown = sorted(set(raw) - set(DEBOUNCE_FIELDS))
    if unknown:
        raise ValidationError(f"{field}.{unknown[0]}", "is not a known field", allowed=DEBOUNCE_FIELDS)
    key = _key(raw.get("key"), f"{field}.key")
    window = _int(
        raw.get("windowMs"),
        f"{field}.windowMs",
        DEBOUNCE_WINDOW_MIN_MS,
        DEBOUNCE_WINDOW_MAX_MS,
        DEBOUNCE_WINDOW_RULE,
    )
    return Debounce(key, window)


def flow_of(body: Mapping[str, Any]) -> Flow:
    """The flow a ``job.enqueued`` body carries. Lenient, as a fold must be: a value of another
    shape (a receipt written by hand) folds to the default rather than failing the stream."""
    try:
        return validate_flow(body)
    except ValidationError:
        return PLAIN
