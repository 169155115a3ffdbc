"""Bounds per tenant (issue 8, "Bounds per tenant"): page bytes, open event streams, write rate.

- **Pages** (``GET /jobs``, receipts pages) stop before ``RECEIPT_MAX_PAGE_BYTES`` of items and
  return the cursor of the last item sent, so a client pages on instead of one response growing
  with whatever tenants stored. A single item larger than the cap is still sent alone (otherwise
  the client could never get past it).
- **Event streams**: at most ``RECEIPT_SSE_MAX_STREAMS_PER_TOKEN`` open per token and
  ``RECEIPT_SSE_MAX_STREAMS_PER_PROCESS`` in all, counted in this API process; past either,
  429 with ``Retry-After``.
- **Writes**: every POST of an organisation counts against ``RECEIPT_RATE_LIMIT_WRITES``, through
  Flask-Limiter (a maintained library: rate strings, fixed windows, Redis or in-memory storage)
  rather than hand-written buckets. Counters live in Redis when ``REDIS_URL`` is set, so every
  API process shares them; the embedded deployment counts in memory, per process. System tokens
  are operators and Receipt's own components: they are not limited.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from flask import Flask, Response, g, request
from flask_limiter import Limiter, RateLimitExceeded

from api.errors import RATE_LIMITED, TOO_MANY_STREAMS, ApiError, error_response
from app.config import Settings

# What a page's envelope may add around its items (keys, the cursor, the stream name).
ENVELOPE_BYTES = 1024
STREAM_RETRY_AFTER_S = 5
RATE_LIMIT_DISABLED = "disabled"


def json_size(value: Any) -> int:
    """Bytes ``value`` takes in a JSON response (compact, ASCII-escaped, as Flask writes it)."""
    return len(json.dumps(value, separators=(",", ":")))


def fit(items: Sequence[Any], max_bytes: int) -> int:
    """How many leading ``items`` fit in a page of ``max_bytes`` (at least one, if there is one)."""
    budget = max_bytes - ENVELOPE_BYTES
    used = 0
    for n, item in enumerate(items):
        used += json_size(item) + 1  # the comma
        if used > budget:
            return max(n, 1)
    return len(items)


class StreamSlots:
    """Open event streams of one API process, per token and in all."""

    def __init__(self, per_token: int, per_process: int) -> None:
        self.per_token = per_token
        self.per_process = per_process
        self._lock = threading.Lock()
        self._by_token: dict[str, int] = {}
        self._total = 0

    def acquire(self, token_key: str) -> Callable[[], None]:
        """Take a slot or raise the 429; returns the release function (safe to call twice)."""
        with self._lock:
            if self._total >= self.per_process:
                raise _too_many(f"this server holds {self._total} event streams, its limit")
            held = self._by_token.get(token_key, 0)
            if held >= self.per_token:
                raise _too_many(f"this token holds {held} open event streams, its limit")
            self._by_token[token_key] = held + 1
            self._total += 1
        released = threading.Event()

        def release() -> None:
            with self._lock:
                if released.is_set():
                    return
                released.set()
                self._total -= 1
                left = self._by_token[token_key] - 1
                if left:
                    self._by_token[token_key] = left
                else:
                    del self._by_token[token_key]

        return release

    def open_for(self, token_key: str) -> int:
        with self._lock:
            return self._by_token.get(token_key, 0)


def _too_many(message: str) -> ApiError:
    return ApiError(
        429,
        TOO_MANY_STREAMS,
        message + "; close one or retry later",
        headers={"Retry-After": str(STREAM_RETRY_AFTER_S)},
    )


def _write_key() -> str:
    identity = g.get("identity")
    if identity is None or identity.organization_id is None:
        return "anonymous"
    return f"org:{identity.organization_id}"


def _exempt() -> bool:
    if request.method != "POST":
        return True
    identity = g.get("identity")
    return identity is None or identity.system


def install_rate_limit(app: Flask, settings: Settings) -> Limiter | None:
    """Limit every organisation's writes; call after authentication is installed (it keys on it)."""
    rate = settings.rate_limit_writes.strip()
    if rate.lower() == RATE_LIMIT_DISABLED:
        return None
    limiter = Limiter(
        _write_key,
        app=app,
        default_limits=[rate],
        default_limits_exempt_when=_exempt,
        storage_uri=settings.redis_url or "memory://",
        strategy="fixed-window",
        key_prefix="receipt-writes",
        # A Redis outage must not stop writes: the limiter falls back to counting in memory.
        swallow_errors=True,
        in_memory_fallback_enabled=True,
    )

    @app.errorhandler(RateLimitExceeded)
    def _rate_limited(exc: RateLimitExceeded) -> Response:
        current = limiter.current_limit
        retry_after = max(1, math.ceil(current.reset_at - time.time())) if current else 1
        return error_response(
            429,
            RATE_LIMITED,
            f"this organisation's write rate limit ({exc.limit.limit}) is used up; retry later",
            {"limit": str(exc.limit.limit)},
            {"Retry-After": str(retry_after)},
        )

    return limiter
