"""An API process reuses what a token stands for for RECEIPT_TOKEN_CACHE_MS (default 1000 ms).

Only tokens that were found are kept; a revocation made in this process empties the cache at once;
one made elsewhere is seen once the TTL has passed; at most ``MAX_ENTRIES`` are kept.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from api import token_cache
from api.token_cache import TokenCache
from app.config import Settings
from app.storage import tokens
from app.storage.tokens import TokenInfo


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Reads:
    """The database's answers, and how many times it was asked."""

    def __init__(self) -> None:
        self.live: dict[str, TokenInfo] = {}
        self.asked = 0

    def __call__(self, secret: str) -> TokenInfo | None:
        self.asked += 1
        return self.live.get(secret)


def info(token_id: str) -> TokenInfo:
    return TokenInfo(token_id, "org-a", False, (), None, datetime(2026, 1, 1, tzinfo=UTC))


def test_the_default_ttl_is_one_second() -> None:
    assert Settings.from_env({}).token_cache_ms == 1000


def test_a_found_token_is_reused_within_the_ttl_and_read_again_after_it() -> None:
    clock, reads = Clock(), Reads()
    reads.live["s1"] = info("t1")
    cache = TokenCache(1000, clock=clock)
    assert cache.lookup("s1", reads) == info("t1")
    clock.now += 0.999
    assert cache.lookup("s1", reads) == info("t1")
    assert reads.asked == 1
    clock.now += 0.001
    del reads.live["s1"]  # revoked from another process
    assert cache.lookup("s1", reads) is None
    assert reads.asked == 2


def test_an_unknown_secret_asks_every_time_so_a_new_token_works_at_once() -> None:
    reads = Reads()
    cache = TokenCache(1000, clock=Clock())
    assert cache.lookup("s2", reads) is None
    reads.live["s2"] = info("t2")
    assert cache.lookup("s2", reads) == info("t2")
    assert reads.asked == 2


def test_a_revocation_in_this_process_empties_it_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    count = [0]
    monkeypatch.setattr(tokens, "revocations", lambda: count[0])
    reads = Reads()
    reads.live["s3"] = info("t3")
    cache = TokenCache(1000, clock=Clock())
    assert cache.lookup("s3", reads) == info("t3")
    del reads.live["s3"]
    count[0] += 1  # tokens.revoke ran in this process
    assert cache.lookup("s3", reads) is None
    assert reads.asked == 2


def test_zero_asks_on_every_request() -> None:
    reads = Reads()
    reads.live["s4"] = info("t4")
    cache = TokenCache(0, clock=Clock())
    for _ in range(3):
        assert cache.lookup("s4", reads) == info("t4")
    assert reads.asked == 3


def test_the_least_recently_used_token_is_dropped_past_max_entries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(token_cache, "MAX_ENTRIES", 2)
    reads = Reads()
    reads.live.update({"a": info("ta"), "b": info("tb"), "c": info("tc")})
    cache = TokenCache(1000, clock=Clock())
    cache.lookup("a", reads)
    cache.lookup("b", reads)
    cache.lookup("a", reads)  # a is now the most recently used
    cache.lookup("c", reads)  # drops b
    asked = reads.asked
    cache.lookup("a", reads)
    cache.lookup("c", reads)
    assert reads.asked == asked
    cache.lookup("b", reads)
    assert reads.asked == asked + 1


def test_the_secret_itself_is_never_kept() -> None:
    reads = Reads()
    reads.live["a-secret-value"] = info("t5")
    cache = TokenCache(1000, clock=Clock())
    cache.lookup("a-secret-value", reads)
    assert "a-secret-value" not in repr(cache._found)
    assert tokens.hash_token("a-secret-value") in cache._found
