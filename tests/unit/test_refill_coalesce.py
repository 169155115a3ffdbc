"""A worker's refill lets the places its ended attempts free gather for ``RECEIPT_REFILL_COALESCE_MS``
before the pass that fills them: asks that arrive within the window fold into one pass."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from app.config import Settings
from delivery.listeners import Refill


def refill(coalesce_ms: int) -> Refill:
    settings = Settings.from_env({"RECEIPT_REFILL_COALESCE_MS": str(coalesce_ms)})
    rt: Any = SimpleNamespace(settings=settings)
    return Refill(rt, ["receipt-chat", "receipt-codex"])


def test_asks_within_the_window_fold_into_one_take() -> None:
    r = refill(300)
    r.ask(["receipt-chat"])
    later = threading.Timer(0.05, lambda: r.ask(["receipt-codex"]))
    later.start()
    began = time.monotonic()
    asked = r._take(5.0)
    later.join()
    assert asked == {"receipt-chat", "receipt-codex"}
    assert time.monotonic() - began >= 0.3 - 0.01  # it waited the window out, not the 5 s look


def test_without_a_window_the_first_ask_is_taken_at_once() -> None:
    r = refill(0)
    r.ask(["receipt-chat"])
    began = time.monotonic()
    assert r._take(5.0) == {"receipt-chat"}
    assert time.monotonic() - began < 0.25


def test_stopping_ends_the_window_at_once() -> None:
    r = refill(1000)
    r.ask(["receipt-chat"])

    def stopping() -> None:  # what Refill.stop does first
        with r._cond:
            r._stopping = True
            r._cond.notify()

    stopper = threading.Timer(0.05, stopping)
    stopper.start()
    began = time.monotonic()
    assert r._take(5.0) is None
    stopper.join()
    assert time.monotonic() - began < 0.5


@pytest.mark.parametrize("value", ["-1", "1001", "soon"])
def test_the_window_is_0_to_1000_ms(value: str) -> None:
    with pytest.raises(ValueError, match="RECEIPT_REFILL_COALESCE_MS"):
        Settings.from_env({"RECEIPT_REFILL_COALESCE_MS": value})
