"""The process's slot counter (workers/slots.py): how many attempts run at once, shared by every
delivery the process runs."""

from __future__ import annotations

import threading

import pytest

from workers.slots import Slots


def test_a_take_gets_what_is_free_now_up_to_what_it_wants() -> None:
    slots = Slots(4)
    assert slots.take(3, 0) == 3
    assert slots.take(5, 0) == 1  # only one left: a batch leases that many now, the rest later
    assert (slots.in_use, slots.free, slots.peak) == (4, 0, 4)
    assert slots.take(1, 0.01) == 0  # none free within the wait
    slots.give(2)
    assert slots.take(5, 0) == 2
    assert slots.peak == 4


def test_a_waiting_take_wakes_when_a_slot_is_given_back() -> None:
    slots = Slots(1)
    assert slots.take(1, 0) == 1
    got: list[int] = []
    waiter = threading.Thread(target=lambda: got.append(slots.take(3, 10)))
    waiter.start()
    slots.give(1)
    waiter.join(10)
    assert not waiter.is_alive() and got == [1]


def test_never_more_than_the_capacity_whoever_takes_them() -> None:
    slots = Slots(3)
    running = 0
    peak = 0
    lock = threading.Lock()

    def attempt() -> None:
        nonlocal running, peak
        assert slots.take(1, 10) == 1
        with lock:
            running += 1
            peak = max(peak, running)
        with lock:
            running -= 1
        slots.give(1)

    threads = [threading.Thread(target=attempt) for _ in range(40)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert peak <= 3 and slots.peak <= 3 and slots.in_use == 0


def test_giving_back_more_than_was_taken_is_a_bug_not_a_silent_refill() -> None:
    slots = Slots(2)
    slots.take(1, 0)
    with pytest.raises(RuntimeError):
        slots.give(2)
    with pytest.raises(ValueError):
        Slots(0)
