"""Bounds per tenant: page bytes, open event streams, write rate.

- **Pages** (``GET /jobs``, receipts pages) stop before ``RECEIPT_MAX_PAGE_BYTES`` of items and
  return the cursor of the last item sent, so a client pages on instead of one response growing
  with whatever tenants stored. A single item larger than the cap is still sent alone (otherwise
  the client could never get past it).
- **Event streams**: at most ``RECEIPT_SSE_MAX_STREAMS_PER_TOKEN`` open per token and
  ``RECEIPT_SSE_MAX_STREAMS_PER_PROCESS`` in all, counted in this API process; past either,
  429 with ``Retry-After``.
- **Writes**: every POST of an organisation counts against ``RECEIPT_RATE_LIMIT_WRITES``, per
  route, through ``limits`` (the maintained library Flask-Limiter is built on: rate strings,
  fixed windows, Redis or in-memory storage) rather than hand-written buckets. Counters live in
  Redis when ``REDIS_URL`` is set, so every API process shares them; the embedded deployment
  counts in memory, per process. System tokens are operators and Receipt's own components: they
  are not limited. ``WriteLimit`` calls ``limits`` from one ``before_request`` hook: the same
  counters, keys and 429 as the Flask-Limiter extension, without that extension's per-request
  resolution of decorated, blueprint and default limits (it cost more CPU than the counting
  itself).
- **A slice of the budget at a time**: a single write takes ``_slice(item)`` writes of a window's
  budget from the shared storage at once (a sixty-fourth of the window's allowance, at most 64;
  one for a limit under 128 a window) and spends them in this process, so one storage round trip
  serves up to that many requests instead of one each (the Redis call was an eighth of an API
  process's CPU per enqueue: ``bench/README.md``). The shared count never passes the limit, since a
  slice is counted when taken; a process's slice left unspent at its window's end goes unused, so an
  organisation busy on several API processes may be refused up to that many writes early.
- **Items, not requests**: a request counts as one write, but a route whose one request carries
  many items (a bulk enqueue) counts each: once it has read how many, it calls
  ``count_items(n)``, which counts the ``n - 1`` the hook did not. A request carrying more items
  than one window allows could never pass, so it is refused with 413 (split it), not a 429 that
  retrying cannot cure; one that would overflow the window is refused before it is counted.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from flask import Flask, current_app, g, request
from limits import RateLimitItem, parse_many
from limits.storage import MemoryStorage, Storage, storage_from_string
from limits.strategies import FixedWindowRateLimiter

from api.errors import PAYLOAD_TOO_LARGE, RATE_LIMITED, TOO_MANY_STREAMS, ApiError
from app.config import Settings

if TYPE_CHECKING:
    from api.auth import Identity  # api.auth imports api.context, which imports this module

log = logging.getLogger("receipt.api")

# What a page's envelope may add around its items (keys, the cursor, the stream name).
ENVELOPE_BYTES = 1024
STREAM_RETRY_AFTER_S = 5
RATE_LIMIT_DISABLED = "disabled"
# Where ``install_rate_limit`` leaves the app's ``WriteLimit`` for ``count_items``.
EXTENSION = "receipt.write_limit"


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


# The storage key prefix; with the route and the organisation the keys are the ones Flask-Limiter
# wrote (``LIMITER/receipt-writes/org:<id>/<endpoint>/<amount>/<multiples>/<granularity>``).
KEY_PREFIX = "receipt-writes"
# After the shared storage failed, how often (seconds) to try it again; meanwhile counts are in memory.
STORAGE_RETRY_S = 1.0
# A slice of a window's budget taken at once for single writes: this share of its allowance, at most
# ``SLICE_MAX`` writes (module docstring).
SLICE_SHARE = 64
SLICE_MAX = 64
# Past this many (organisation, route, rate) slices held, taking a new one first drops the expired.
HELD_PRUNE_AT = 4096


def _slice(item: RateLimitItem) -> int:
    """How many writes of ``item``'s window one trip to the shared storage takes for single writes."""
    return max(1, min(SLICE_MAX, item.amount // SLICE_SHARE))


@dataclass
class _Held:
    """Writes of one window taken from the shared storage and not spent yet, in this process."""

    left: int
    until: float  # monotonic: the window's end, when what is left stops counting


def _write_key(identity: Identity) -> str:
    if identity is None or identity.organization_id is None:
        return "anonymous"
    return f"org:{identity.organization_id}"


class WriteLimit:
    """The per-organisation write limit: ``check()`` counts this request or raises the 429.

    A POST counts against each rate of ``RECEIPT_RATE_LIMIT_WRITES`` for (organisation, route).
    Not counted: other methods, requests no route matched, requests without an identity (the
    dashboard's own routes) and system identities. A shared storage (Redis) that fails does not
    stop writes: counting moves to memory, and the storage is tried again every
    ``STORAGE_RETRY_S`` seconds.
    """

    def __init__(self, rate: str, storage_uri: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        # Shortest window first, as Flask-Limiter checked them; the first one used up answers.
        self.items: list[RateLimitItem] = sorted(parse_many(rate))
        storage = storage_from_string(storage_uri)
        if not isinstance(storage, Storage):  # an ``async+`` URI: not for a WSGI process
            raise ValueError(f"the rate limit storage {type(storage).__name__} is not synchronous")
        self.storage = storage
        self.shared = FixedWindowRateLimiter(self.storage)
        self.fallback = FixedWindowRateLimiter(MemoryStorage())
        self._clock = clock
        self._storage_dead_since: float | None = None
        self._held: dict[tuple[RateLimitItem, tuple[str, ...]], _Held] = {}
        self._held_lock = threading.Lock()

    def _strategy(self) -> FixedWindowRateLimiter:
        """The shared storage's limiter, or memory's while the shared one is down (probed each interval)."""
        dead_since = self._storage_dead_since
        if dead_since is None:
            return self.shared
        if self._clock() - dead_since < STORAGE_RETRY_S:
            return self.fallback
        self._storage_dead_since = self._clock()  # one probe per interval
        if self.storage.check():
            log.info("rate limit storage recovered")
            self._storage_dead_since = None
            return self.shared
        return self.fallback

    def check(self) -> None:
        """The ``before_request`` hook: count this request as one write, or raise the 429."""
        self.count(1)

    def count(self, cost: int, *, counted: int = 0) -> None:
        """Count ``cost`` more writes for the current request's organisation and route, or raise.

        ``counted``: writes of this request already counted. Nothing is counted for requests that
        are not limited (see the class doc). A request whose writes in all (``counted + cost``) pass
        what one window of some rate allows raises 413: no wait would let it through.
        """
        endpoint = request.endpoint
        identity: Identity | None = g.get("identity")
        if request.method != "POST" or endpoint is None or identity is None or identity.system:
            return
        if cost < 1:
            return
        for item in self.items:
            if counted + cost > item.amount:
                raise ApiError(
                    413,
                    PAYLOAD_TOO_LARGE,
                    f"this request carries {counted + cost} writes; the write rate limit ({item}) "
                    f"allows {item.amount} per window: split it",
                    {"items": counted + cost, "limit": str(item)},
                )
        keys = (KEY_PREFIX, _write_key(identity), endpoint)
        strategy = self._strategy()
        try:
            self._hit(strategy, keys, cost)
        except ApiError:
            raise
        except Exception:
            if strategy is self.fallback:
                raise
            log.warning("rate limit storage unreachable - falling back to in-memory storage")
            self._storage_dead_since = self._clock()
            self._hit(self.fallback, keys, cost)

    def _hit(self, strategy: FixedWindowRateLimiter, keys: tuple[str, ...], cost: int) -> None:
        for item in self.items:
            if cost == 1 and strategy is self.shared and self._spend_held(item, keys, strategy):
                continue
            # Several items that would overflow the window are refused without being counted, so a
            # refused bulk request does not use up the budget of the single writes after it.
            fits = cost == 1 or strategy.test(item, *keys, cost=cost)
            if not (fits and strategy.hit(item, *keys, cost=cost)):
                reset_at = strategy.get_window_stats(item, *keys).reset_time
                retry_after = max(1, math.ceil(reset_at - time.time()))
                raise ApiError(
                    429,
                    RATE_LIMITED,
                    f"this organisation's write rate limit ({item}) is used up; retry later",
                    {"limit": str(item)},
                    {"Retry-After": str(retry_after)},
                )

    def _spend_held(
        self, item: RateLimitItem, keys: tuple[str, ...], strategy: FixedWindowRateLimiter
    ) -> bool:
        """Count one write against what this process holds of ``item``'s window, taking a slice from
        the shared storage when it holds none; False when no slice could be taken (fewer writes are
        left in the window than a slice: the caller counts this one alone)."""
        now = self._clock()
        with self._held_lock:
            held = self._held.get((item, keys))
            if held is not None and held.left > 0 and now < held.until:
                held.left -= 1
                return True
        size = _slice(item)
        # Tested first, as a bulk request's items are: a refused hit is counted all the same.
        if size < 2 or not strategy.test(item, *keys, cost=size) or not strategy.hit(item, *keys, cost=size):
            return False
        ends_in = strategy.get_window_stats(item, *keys).reset_time - time.time()
        with self._held_lock:
            if len(self._held) >= HELD_PRUNE_AT:
                self._held = {k: h for k, h in self._held.items() if h.until > now}
            self._held[(item, keys)] = _Held(size - 1, now + ends_in)
        return True


def install_rate_limit(app: Flask, settings: Settings) -> WriteLimit | None:
    """Limit every organisation's writes; call after authentication is installed (it keys on it)."""
    rate = settings.rate_limit_writes.strip()
    if rate.lower() == RATE_LIMIT_DISABLED:
        return None
    limit = WriteLimit(rate, settings.redis_url or "memory://")
    app.before_request(limit.check)
    app.extensions[EXTENSION] = limit
    return limit


def count_items(n: int) -> None:
    """Count a request that carries ``n`` items as ``n`` writes (call from the view, once known).

    The ``before_request`` hook already counted the request as one, so ``n - 1`` more are counted;
    with the limit disabled this does nothing.
    """
    limit: WriteLimit | None = current_app.extensions.get(EXTENSION)
    if limit is not None and n > 1:
        limit.count(n - 1, counted=1)
