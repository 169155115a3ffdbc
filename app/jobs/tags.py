"""A job's tags: a small bounded map of strings an enqueue may carry, kept in ``job.enqueued``.

They are for finding jobs again (``GET /jobs?tag=key:value``, bulk actions on a filter), never
for deciding anything: no rule reads them. The caps keep every job's row and index entry small
whatever a client sends; a tag filter is ``key:value``, so a key holds no ``:``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

from app.jobs.errors import ValidationError

TAGS_FIELD: Final = "tags"
TAGS_MAX_KEYS: Final = 16
TAG_KEY_MAX: Final = 64
TAG_VALUE_MAX: Final = 128
# A key: letters, digits, '.', '_' and '-', starting with a letter or digit.
TAG_KEY_PATTERN: Final = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
TAG_KEY_RULE: Final = (
    f"must be 1-{TAG_KEY_MAX} characters of letters, digits, '.', '_' or '-', starting with a letter or digit"
)
# A value: any printable text (no control characters), 1..TAG_VALUE_MAX characters.
TAG_VALUE_PATTERN: Final = re.compile(r"^[^\x00-\x1f\x7f]{1,128}$")
TAG_VALUE_RULE: Final = f"must be a string of 1-{TAG_VALUE_MAX} characters without control characters"
# A filter names one tag: ``key:value`` (the first ':' separates them).
TAG_FILTER_PATTERN: Final = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]{0,63}):([^\x00-\x1f\x7f]{1,128})$")
TAG_FILTER_RULE: Final = (
    f"must be key:value: a key of 1-{TAG_KEY_MAX} letters, digits, '.', '_' or '-' (starting with a "
    f"letter or digit), then ':' and a value of 1-{TAG_VALUE_MAX} characters without control characters"
)


def validate_tags(raw: Any, field: str = TAGS_FIELD) -> dict[str, str]:
    """The tags of an enqueue (``{}`` for none), or a ``ValidationError`` naming the tag and its limit."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise ValidationError(field, f"must be an object of at most {TAGS_MAX_KEYS} string tags")
    if len(raw) > TAGS_MAX_KEYS:
        raise ValidationError(field, f"holds {len(raw)} tags; at most {TAGS_MAX_KEYS}")
    tags: dict[str, str] = {}
    for key, value in raw.items():
        if not isinstance(key, str) or not TAG_KEY_PATTERN.fullmatch(key):
            raise ValidationError(
                f"{field}.{str(key)[:TAG_KEY_MAX]}", f"is not a tag key: a key {TAG_KEY_RULE}"
            )
        if not isinstance(value, str) or not TAG_VALUE_PATTERN.fullmatch(value):
            raise ValidationError(f"{field}.{key}", TAG_VALUE_RULE)
        tags[key] = value
    return dict(sorted(tags.items()))


def parse_tag_filter(raw: str, field: str = "tag") -> tuple[str, str]:
    """``key:value`` as a (key, value) pair, or a ``ValidationError`` naming ``field``."""
    match = TAG_FILTER_PATTERN.fullmatch(raw)
    if match is None:
        raise ValidationError(field, TAG_FILTER_RULE)
    return match.group(1), match.group(2)


def tags_of(body: Mapping[str, Any]) -> dict[str, str]:
    """The tags a ``job.enqueued`` body carries; a receipt written without them (or hand-edited
    into another shape) folds to none, so old receipts fold unchanged."""
    raw = body.get(TAGS_FIELD)
    if not isinstance(raw, Mapping):
        return {}
    return {k: v for k, v in raw.items() if isinstance(k, str) and isinstance(v, str)}
