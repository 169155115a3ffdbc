"""One dispatch pass per queue at a time in a process; asks meanwhile fold into one more pass."""

from __future__ import annotations

import threading

import pytest

from app.dispatch.gate import PassGate

WAIT_S = 10


def test_asks_during_a_pass_return_at_once_and_fold_into_one_more_pass() -> None:
    gate = PassGate()
    inside, release = threading.Event(), threading.Event()
    passes: list[int] = []

    def one_pass() -> list[str]:
        passes.append(len(passes))
        if len(passes) == 1:
            inside.set()
            assert release.wait(WAIT_S)
        return [f"sent-by-pass-{len(passes)}"]

    made: list[list[str]] = []
    runner = threading.Thread(target=lambda: made.append(gate.run("chat", one_pass)))
    runner.start()
    assert inside.wait(WAIT_S)
    # Five asks while the first pass runs: each returns nothing at once.
    assert [gate.run("chat", one_pass) for _ in range(5)] == [[]] * 5
    release.set()
    runner.join(WAIT_S)
    assert not runner.is_alive()
    assert passes == [0, 1]  # the first pass, then exactly one more for the five asks
    assert made == [["sent-by-pass-1", "sent-by-pass-2"]]


def test_queues_do_not_fold_into_each_other() -> None:
    gate = PassGate()
    inside, release = threading.Event(), threading.Event()

    def slow() -> list[str]:
        inside.set()
        assert release.wait(WAIT_S)
        return ["chat"]

    runner = threading.Thread(target=gate.run, args=("chat", slow))
    runner.start()
    assert inside.wait(WAIT_S)
    assert gate.run("codex", lambda: ["codex"]) == ["codex"]
    release.set()
    runner.join(WAIT_S)


def test_a_failed_pass_leaves_the_gate_open_for_the_next_ask() -> None:
    gate = PassGate()

    def broken() -> list[str]:
        raise RuntimeError("database went away")

    with pytest.raises(RuntimeError):
        gate.run("chat", broken)
    assert gate.run("chat", lambda: ["sent"]) == ["sent"]
