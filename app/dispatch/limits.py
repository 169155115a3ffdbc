"""Which concurrency limit and which rate limiter govern a key: the operator's prefixes first.

A key is always an organisation's own (``app.jobs.flow``), so each limiter is named after both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from app.jobs.flow import CONCURRENCY_LIMIT_MAX, FALLBACK_CONCURRENCY_LIMIT

KEY_LIMITER: Final = "key"
ORG_LIMITER: Final = "org"
# No job's own limit is above this: a key this full is full whatever its jobs say.
CONCURRENCY_LIMIT_CAP: Final = CONCURRENCY_LIMIT_MAX


def _first(pairs: Sequence[tuple[str, float]], key: str) -> tuple[str, float] | None:
    # ``pairs`` come longest prefix first (app.config), so the first match is the longest.
    for prefix, value in pairs:
        if key.startswith(prefix):
            return prefix, value
    return None


def declared_limit(declared: Sequence[tuple[str, int]], key: str) -> int | None:
    """The operator's limit for the key's longest declared prefix, if one matches."""
    found = _first(declared, key)
    return int(found[1]) if found is not None else None


def concurrency_limit(declared: Sequence[tuple[str, int]], key: str, own: int | None) -> int:
    """The operator's limit for the key's longest declared prefix, else the job's own, else 1."""
    operator = declared_limit(declared, key)
    if operator is not None:
        return operator
    return own if own is not None else FALLBACK_CONCURRENCY_LIMIT


def key_rate(declared: Sequence[tuple[str, float]], org: str, key: str) -> tuple[str, float] | None:
    """The limiter (its name and rate per second) of an organisation's key, if a prefix declares one."""
    found = _first(declared, key)
    if found is None:
        return None
    return f"{KEY_LIMITER}:{org}:{key}", found[1]


def org_limiter(org: str) -> str:
    return f"{ORG_LIMITER}:{org}"
