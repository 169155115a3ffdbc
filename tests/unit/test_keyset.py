"""The one keyset pager (app/storage/keyset.py) every newest-first list pages with: a page of
``limit`` rows, and the cursor after its last row only when another row follows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from app.storage import keyset

T0 = datetime(2026, 12, 7, 12, 0, tzinfo=UTC)


def rows(n: int) -> list[SimpleNamespace]:
    """Newest first, as ``keyset.newest_first`` orders them."""
    return [SimpleNamespace(created_at=T0 - timedelta(seconds=i), id=f"o/job-{i}") for i in range(n)]


def test_a_page_that_holds_every_row_left_has_no_next_cursor() -> None:
    got, cursor = keyset.page(rows(3), 3)
    assert [r.id for r in got] == ["o/job-0", "o/job-1", "o/job-2"] and cursor is None


def test_the_row_past_the_limit_makes_the_cursor_after_the_pages_last_row() -> None:
    got, cursor = keyset.page(rows(4), 3)
    assert [r.id for r in got] == ["o/job-0", "o/job-1", "o/job-2"]
    assert cursor == keyset.encode_cursor(T0 - timedelta(seconds=2), "o/job-2")
    assert keyset.decode_cursor(cursor) == (T0 - timedelta(seconds=2), "o/job-2")
