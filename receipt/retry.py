"""When the client tries a refused request again: the server's ``Retry-After``, bounded, with jitter.

The API refuses with ``429`` when an organisation's write limit is used up or a token holds too
many event streams, and with ``503`` when its database is unreachable; both say in
``Retry-After`` when to come back. ``RetryPolicy.delay`` is the whole decision, a pure function of
what happened so far (tries made, seconds already waited, the header, a random number), so it is
tested without a clock; ``receipt.client.Client`` does the sleeping.

Which refusals are worth repeating is decided by the client, not here: a ``429`` is refused before
anything ran, so it is always safe to repeat; a ``503`` may come after a write was committed (a
connection lost during the commit), so the client repeats it only for a request that is safe to
send twice (a read, or a write with an idempotency key).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

# What the server answers when it wants the request again later.
RETRYABLE_STATUSES = frozenset({429, 503})


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to wait for a refused request.

    ``max_tries`` counts every try, the first included (1: never retry); ``max_wait`` bounds the
    seconds slept across all retries of one request: a wait that would pass it is not started,
    the refusal is raised instead. Each wait is the server's ``Retry-After`` (``fallback_wait``
    when a 429 has none) plus a random ``0..jitter`` seconds, so clients refused in the same
    window do not all return at the same instant (the write limit's windows are fixed: every
    caller's ``Retry-After`` points at the same reset).
    """

    max_tries: int = 5
    # A little over two write-limit windows (a minute each): a loop refused at the start of one
    # window still lands after it resets, even if the next window fills before its turn.
    max_wait: float = 150.0
    jitter: float = 1.0
    fallback_wait: float = 1.0

    def __post_init__(self) -> None:
        if self.max_tries < 1:
            raise ValueError(f"max_tries must be at least 1, not {self.max_tries}")
        for name in ("max_wait", "jitter", "fallback_wait"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number of seconds >= 0, not {value!r}")

    def delay(self, *, tries: int, waited: float, retry_after: float | None, rand: float) -> float | None:
        """Seconds to sleep before the next try, or None to give up and raise the refusal.

        ``tries``: tries made so far (1 after the first refusal); ``waited``: seconds already slept
        for this request; ``retry_after``: the header's seconds (None when absent or unreadable);
        ``rand``: a number in ``[0, 1)``, the jitter's share.
        """
        if tries >= self.max_tries:
            return None
        base = self.fallback_wait if retry_after is None else max(0.0, retry_after)
        wait = base + rand * self.jitter
        if waited + wait > self.max_wait:
            return None
        return wait


# ``Client(retry=NO_RETRY)`` and ``retry=None`` both turn retrying off.
NO_RETRY = RetryPolicy(max_tries=1)


def parse_retry_after(value: str | None, now: datetime | None = None) -> float | None:
    """``Retry-After`` in seconds: delta-seconds or an HTTP-date (RFC 9110); None if unreadable."""
    if value is None or not value.strip():
        return None
    text = value.strip()
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError):
            return None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())
    return seconds if math.isfinite(seconds) and seconds >= 0 else None
