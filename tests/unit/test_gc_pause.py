"""The collector pause: off while any thread is inside, back on after the last, and a collector
the process turned off itself stays off."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from app.gc_pause import paused


@pytest.fixture(autouse=True)
def collector_restored() -> Iterator[None]:
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()


def test_off_inside_and_on_after() -> None:
    gc.enable()
    with paused():
        assert not gc.isenabled()
        with paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_on_again_only_when_the_last_thread_leaves() -> None:
    gc.enable()
    inside, leave = threading.Event(), threading.Event()

    def other() -> None:
        with paused():
            inside.set()
            assert leave.wait(10)

    t = threading.Thread(target=other)
    t.start()
    assert inside.wait(10)
    with paused():
        pass
    assert not gc.isenabled()  # the other thread is still inside
    leave.set()
    t.join(10)
    assert gc.isenabled()


def test_a_collector_turned_off_by_the_process_stays_off() -> None:
    gc.disable()
    with paused():
        pass
    assert not gc.isenabled()


def test_on_again_after_an_exception() -> None:
    gc.enable()
    with pytest.raises(RuntimeError), paused():
        raise RuntimeError("boom")
    assert gc.isenabled()
