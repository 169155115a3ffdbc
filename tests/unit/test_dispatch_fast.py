"""The room a pass leaves for direct claims (``app/dispatch/fast.py``), as pure functions."""

from __future__ import annotations

from datetime import UTC, datetime

from app.dispatch import fast
from app.dispatch.choice import Waiting
from app.dispatch.line import Capacity, PassResult

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def result(places: int, claimed: int = 0, *, waiting: bool = False, blocked: bool = False) -> PassResult:
    return PassResult(
        "receipt-chat",
        NOW,
        Capacity(places, 1),
        0,
        places,
        [(object(), object())] * claimed,  # type: ignore[list-item]
        {"j": Waiting("share")} if waiting else {},
        blocked=blocked,
    )


def test_the_room_is_the_places_the_pass_left_less_what_was_spent_since() -> None:
    assert fast.room(result(8, claimed=1), ran_at=10.0, now=10.5, spent=2) == 5
    assert fast.room(result(8, claimed=8), ran_at=10.0, now=10.5, spent=0) == 0


def test_no_room_once_a_line_waits_or_the_pass_is_older_than_the_window() -> None:
    assert fast.room(result(8, waiting=True), 10.0, 10.1, 0) == 0
    assert fast.room(result(8, blocked=True), 10.0, 10.1, 0) == 0
    assert fast.WINDOW_S == 1.0
    assert fast.room(result(8), 10.0, 11.0, 0) == 8
    assert fast.room(result(8), 10.0, 11.01, 0) == 0
    assert fast.room(None, 0.0, 0.0, 0) == 0


def test_rooms_reserve_what_they_grant_and_a_pass_resets_them() -> None:
    rooms = fast.Rooms()
    last = (10.0, result(3))
    assert rooms.any_room({"receipt-chat": last}, 10.1)
    assert rooms.take("receipt-chat", last, 10.1, 2) == 2
    assert rooms.take("receipt-chat", last, 10.1, 2) == 1  # one place was left
    assert rooms.take("receipt-chat", last, 10.1, 1) == 0
    assert not rooms.any_room({"receipt-chat": last}, 10.1)
    rooms.reset("receipt-chat")
    assert rooms.take("receipt-chat", last, 10.1, 5) == 3
