"""What a token secret stands for, kept by an API process for ``RECEIPT_TOKEN_CACHE_MS``.

Every request with a Bearer token, and every dashboard page by its cookie, asks what the token
stands for (``api.auth.identity_for``). Asked of the database each time, that is a round trip and
a pool checkout per request: about a tenth of the API's CPU per enqueue (bench/README.md). The
process keeps each answer for a short while instead:

- only tokens that were found are kept: an unknown or revoked secret asks every time, so a new
  token works at once and guessing gains nothing;
- keyed by the secret's SHA-256 (``tokens.hash_token``), as the database keys it: the secret
  itself is never kept;
- the expiry is checked on every request, against the kept ``expires_at``;
- a revocation made in this process (``tokens.revoke``) empties it at once; one made elsewhere
  (``receipt token revoke`` on another machine) is seen within the TTL, the bound
  docs/security.md states;
- at most ``MAX_ENTRIES`` tokens, the least recently used dropped first.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable

from app.storage import tokens
from app.storage.tokens import TokenInfo

# Far more live tokens than one API process serves at once; each entry is a few hundred bytes.
MAX_ENTRIES = 4096


class TokenCache:
    """Found tokens by secret hash, each reused for ``ttl_ms`` after it was read (0: never kept)."""

    def __init__(self, ttl_ms: int, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_ms / 1000
        self._clock = clock
        self._lock = threading.Lock()
        self._found: OrderedDict[str, tuple[float, TokenInfo]] = OrderedDict()
        self._revocations = tokens.revocations()

    def lookup(self, secret: str, read: Callable[[str], TokenInfo | None]) -> TokenInfo | None:
        """The unrevoked token of ``secret``: kept, or ``read`` from the database (and kept)."""
        if self.ttl_s <= 0:
            return read(secret)
        digest = tokens.hash_token(secret)
        now = self._clock()
        with self._lock:
            revocations = tokens.revocations()
            if revocations != self._revocations:
                self._found.clear()
                self._revocations = revocations
            kept = self._found.get(digest)
            if kept is not None and now - kept[0] < self.ttl_s:
                self._found.move_to_end(digest)
                return kept[1]
        info = read(secret)
        with self._lock:
            if info is None or tokens.revocations() != self._revocations:
                self._found.pop(digest, None)
                return info
            self._found[digest] = (now, info)
            self._found.move_to_end(digest)
            while len(self._found) > MAX_ENTRIES:
                self._found.popitem(last=False)
        return info
