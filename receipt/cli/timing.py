"""Times and durations as the developer CLI reads them (``--at``, ``--in``, ``--from``/``--to``)."""

from __future__ import annotations

import re
from datetime import datetime

import click

_PART = re.compile(r"([0-9]+)(ms|s|m|h|d|w)")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, "w": 604_800_000}


def duration_ms(text: str, option: str) -> int:
    """``90s``, ``10m``, ``1h30m``, ``2d``, ``500ms`` (a bare number is milliseconds) -> milliseconds."""
    value = text.strip().lower()
    if value.isdigit():
        return int(value)
    parts = _PART.findall(value)
    if not value or "".join(n + u for n, u in parts) != value:
        raise click.BadParameter(
            f"{text!r} is not a duration: use a number and a unit (ms, s, m, h, d, w), e.g. 90s, 10m, 1h30m",
            param_hint=option,
        )
    return sum(int(n) * _UNIT_MS[u] for n, u in parts)


def at_option(text: str, option: str = "--at") -> str:
    """RFC 3339 text for the API: as given when it carries an offset; without one, this machine's
    local time zone is attached (the server refuses a time without an offset)."""
    value = text.strip()
    try:
        parsed = datetime.fromisoformat(value[:-1] + "+00:00" if value[-1:] in "zZ" else value)
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not a date-time: use RFC 3339, e.g. 2026-05-01T09:00:00Z "
            "(or 2026-05-01T09:00 for this machine's local time)",
            param_hint=option,
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.astimezone()  # this machine's zone, as the user read the clock
    return parsed.isoformat()
