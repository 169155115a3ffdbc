"""``receipt.testing`` and a deploy: a handler that checkpoints on shutdown resumes where it was."""

from __future__ import annotations

from typing import Any

import pytest

from receipt.testing import InlineRuntime, JobContext


def counting(ctx: JobContext) -> Any:
    """Counts steps from its checkpoint; on shutdown saves the step it reached and stops."""
    step = (ctx.checkpoint or {}).get("step", 0)
    if step:
        return {"resumedAt": step, "attempt": ctx.attempt}
    step = 5  # the work done before the deploy
    ctx.progress({"started": True})
    if ctx.wait_cancelled(30):
        ctx.progress({"step": step, "why": ctx.cancel_reason, "knew": ctx.shutting_down})
        return {"stopped": True}
    raise AssertionError("never stopped")


def test_a_deploy_hands_the_attempt_back_and_the_next_one_resumes_from_the_checkpoint() -> None:
    with InlineRuntime({"counter": counting}) as rt:
        rt.enqueue("counter", jobId="j1", maxAttempts=1)
        running = rt.start("j1")
        running.wait_for(lambda job: job.progress == {"started": True})
        rt.shut_down(grace_ms=1000)  # finish window 0: cancelled at once, 0.5 s to save
        ran = running.wait()
        assert ran.status == "released" and ran.job is not None and ran.job.status == "queued"
        assert ran.job.progress == {"step": 5, "why": "shutdown", "knew": True}
        assert rt.types("j1")[-1] == "job.released"
        with pytest.raises(AssertionError, match="restart"):
            rt.drain()
        rt.restart()
        [again] = rt.drain()
        # maxAttempts 1, second attempt: the released one was not charged.
        assert again.status == "completed" and again.job is not None
        assert again.job.result == {"resumedAt": 5, "attempt": 2}
        assert (again.job.attempt, again.job.released) == (2, 1)
