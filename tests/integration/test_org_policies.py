"""Organisation dispatch policies stored (``app.storage.org_policies``) on every backend: one
``organization.dispatch_set`` receipt per change and its projection row, in one transaction; what
the dispatch pass reads (``app.dispatch.policies.org_policies``), cached per process for a second."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import select
from sqlalchemy.engine import Engine

from app.config import Settings
from app.dispatch import policies
from app.dispatch.policies import OrgPolicy, org_policies
from app.storage import org_policies as stored
from app.storage import store
from app.storage.db import org_dispatch_policies


@pytest.fixture(autouse=True)
def _fresh_cache() -> Iterator[None]:
    policies.forget_cached()
    yield
    policies.forget_cached()


def stream_of(engine: Engine, org: str) -> list[store.StoredReceipt]:
    with engine.connect() as conn:
        return store.read_stream(conn, stored.policy_stream(org))


def rows(engine: Engine) -> list[tuple[object, ...]]:
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                select(org_dispatch_policies).order_by(org_dispatch_policies.c.organization_id)
            )
        ]


def test_a_policy_is_a_receipt_and_its_row_and_the_same_one_again_writes_nothing(engine: Engine) -> None:
    policy, written = stored.set_policy(engine, "org-a", 3.0, 20.0, by={"tokenId": "tok_1", "system": True})
    assert written and (policy.weight, policy.rate_per_s) == (3.0, 20.0) and policy.updated_at is not None
    [receipt] = stream_of(engine, "org-a")
    assert receipt.type == stored.SET_EVENT
    assert receipt.body == {
        "organizationId": "org-a",
        "weight": 3.0,
        "ratePerSecond": 20.0,
        "by": {"tokenId": "tok_1", "system": True},
    }
    assert [(r[0], r[1], r[2], r[3]) for r in rows(engine)] == [("org-a", 3.0, 20.0, 1)]
    again, written = stored.set_policy(engine, "org-a", 3.0, 20.0)
    assert not written and again == policy and len(stream_of(engine, "org-a")) == 1
    with engine.connect() as conn:
        assert stored.get(conn, "org-a") == policy
        assert stored.get(conn, "org-b") is None


def test_clearing_both_fields_removes_the_row_and_keeps_the_history(engine: Engine) -> None:
    stored.set_policy(engine, "org-a", 2.0, None)
    cleared, written = stored.set_policy(engine, "org-a", None, None)
    assert written and cleared.empty
    assert rows(engine) == []
    assert [r.body["weight"] for r in stream_of(engine, "org-a")] == [2.0, None]
    # Clearing what was never set writes nothing.
    assert stored.set_policy(engine, "org-new", None, None)[1] is False
    assert stream_of(engine, "org-new") == []


def read(engine: Engine, settings: Settings) -> dict[str, OrgPolicy]:
    with engine.connect() as conn:
        return dict(org_policies(conn, settings))


def test_the_pass_reads_the_api_over_the_settings_cached_for_a_second(engine: Engine) -> None:
    settings = Settings(org_weights=(("org-a", 3.0),), org_rate_limits=(("org-b", 5.0),))
    assert read(engine, settings) == {"org-a": OrgPolicy(3.0, None), "org-b": OrgPolicy(1.0, 5.0)}
    stored.set_policy(engine, "org-a", None, 10.0)
    stored.set_policy(engine, "org-c", 0.5, None)
    # Within the second, the pass keeps what it read (another process learns it within a second)...
    assert read(engine, settings)["org-a"] == OrgPolicy(3.0, None)
    policies.forget_cached()  # ...and the process that set it forgets at once.
    assert read(engine, settings) == {
        "org-a": OrgPolicy(3.0, 10.0),
        "org-b": OrgPolicy(1.0, 5.0),
        "org-c": OrgPolicy(0.5, None),
    }


def test_the_cache_lasts_about_a_second(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [1000.0]
    monkeypatch.setattr(policies, "clock", lambda: clock[0])
    settings = Settings()
    assert read(engine, settings) == {}
    stored.set_policy(engine, "org-a", 4.0, None)
    clock[0] += policies.CACHE_SECONDS / 2
    assert read(engine, settings) == {}
    clock[0] += policies.CACHE_SECONDS
    assert read(engine, settings) == {"org-a": OrgPolicy(4.0, None)}


@pytest.mark.one_backend
def test_concurrent_sets_each_write_one_receipt_and_the_row_is_the_last(pg_engine: Engine) -> None:
    threads = 8
    barrier = threading.Barrier(threads, timeout=30)

    def put(n: int) -> None:
        barrier.wait()
        stored.set_policy(pg_engine, "org-a", float(n + 1), None)

    with ThreadPoolExecutor(max_workers=threads) as pool:
        for future in [pool.submit(put, n) for n in range(threads)]:
            future.result(timeout=60)
    receipts = stream_of(pg_engine, "org-a")
    assert [r.seq for r in receipts] == list(range(1, threads + 1))
    assert sorted(r.body["weight"] for r in receipts) == [float(n + 1) for n in range(threads)]
    [row] = rows(pg_engine)
    assert (row[1], row[3]) == (receipts[-1].body["weight"], threads)
