"""How a shutdown's grace is spent, and the process flag (``app/ops/shutdown.py``): pure."""

from __future__ import annotations

import pytest

from app.ops.shutdown import GracePlan, Shutdown


@pytest.mark.parametrize(
    ("grace", "finish", "stop", "handler_stop"),
    [
        (20_000, 15_000, 5_000, 2_500),  # the default: well inside Heroku's and Render's 30 s
        (4_000, 3_000, 1_000, 500),  # Fly's 5 s kill timeout, with a second to spare
        (1_000, 0, 1_000, 500),  # a tiny grace: cancel at once, still release inside it
        (600, 0, 600, 300),
        (0, 0, 0, 0),
        (-5, 0, 0, 0),
    ],
)
def test_the_grace_is_split_into_finish_and_stop(
    grace: int, finish: int, stop: int, handler_stop: int
) -> None:
    plan = GracePlan(grace)
    assert (plan.finish_ms, plan.stop_ms, plan.handler_stop_ms) == (finish, stop, handler_stop)
    assert plan.finish_ms + plan.stop_ms == max(0, grace)  # everything ends inside the grace


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_first_sigterm_starts_the_clock_and_a_second_changes_nothing() -> None:
    clock = Clock()
    s = Shutdown(clock)
    assert not s.requested and s.seconds_to_cancel() is None and not s.cancel_due()
    assert s.begin(4_000) is True
    assert s.requested and s.seconds_to_cancel() == pytest.approx(3.0)
    clock.now += 2.0
    assert s.begin(60_000) is False  # the grace counts from the first signal, with its plan
    assert s.seconds_to_cancel() == pytest.approx(1.0) and s.seconds_left() == pytest.approx(2.0)
    clock.now += 1.0
    assert s.cancel_due()
    clock.now += 5.0
    assert s.seconds_left() == 0.0
    s.reset()
    assert not s.requested and not s.wait(0)
