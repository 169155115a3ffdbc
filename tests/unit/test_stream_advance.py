"""``store.advance``: the one step every stream (jobs, objectives, schedules) takes before its
writes — its receipts hashed into the chain after the head, then folded by the stream's reducer."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from app.jobs.errors import AppendConflict
from app.jobs.reducer import Receipt
from app.storage import store

AT = datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


def counting(state: dict[str, Any] | None, receipt: Receipt) -> dict[str, Any] | None:
    seen = [] if state is None else state["seen"]
    return {"seen": [*seen, (receipt.seq, receipt.type)]}


def test_a_new_stream_starts_at_seq_one_with_no_previous_hash_and_folds_every_event() -> None:
    chained, state = store.advance(
        "s/new", None, (0, None), [("a.one", {}), ("a.two", {"x": 1})], counting, at=AT
    )
    assert [r["seq"] for r in chained.rows] == [1, 2]
    assert chained.rows[0]["prev_hash"] is None
    assert chained.rows[1]["prev_hash"] == chained.rows[0]["hash"]
    assert state == {"seen": [(1, "a.one"), (2, "a.two")]}


def test_it_continues_the_chain_after_the_head_and_folds_onto_the_state_given() -> None:
    first, state = store.advance("s/a", None, (0, None), [("a.one", {})], counting, at=AT)
    chained, after = store.advance("s/a", state, (1, first.last_hash), [("a.two", {})], counting, at=AT)
    assert chained.rows[0]["seq"] == 2 and chained.rows[0]["prev_hash"] == first.last_hash
    # The same hash a direct chain computes: advance adds the fold, nothing to the chain.
    assert chained.rows == store.chain("s/a", 1, [("a.two", {})], prev_hash=first.last_hash, at=AT).rows
    assert after == {"seen": [(1, "a.one"), (2, "a.two")]}


def test_nothing_to_apply_and_a_fold_to_nothing_are_conflicts_before_anything_is_written() -> None:
    with pytest.raises(AppendConflict, match="s/a: nothing to apply"):
        store.advance("s/a", None, (0, None), [], counting, at=AT)
    with pytest.raises(AppendConflict, match="s/a: the receipts fold to no state"):
        store.advance("s/a", None, (0, None), [("a.one", {})], lambda _s, _r: None, at=AT)
