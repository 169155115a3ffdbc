"""An attempt during its worker's planned shutdown (``workers/runner.py`` with ``app/ops/shutdown.py``),
on every backend: no Celery, real receipts, the real clock, a ``Shutdown`` of the test's own."""

from __future__ import annotations

import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from app.config import Settings
from app.jobs.times import parse_iso
from app.ops.shutdown import Shutdown
from app.storage.queue import Queue
from workers.handler import HandlerError, JobContext
from workers.runner import run_attempt

from .runtime_support import enqueue, receipts_of, registry_of

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone

LEASE_3S = Settings.from_env({"JOB_LEASE_MS": "3000", "RECEIPT_RESONATE_HEARTBEAT_INTERVAL_MS": "1000"})
GRACE_MS = 1_200  # finish window 200 ms, stop window 1 000 ms
BOUND_S = 10.0


class Checkpointing:
    """Counts steps from the checkpoint it was given; on cancellation saves where it got to."""

    def __init__(self, steps_before_block: int = 3) -> None:
        self.started = threading.Event()
        self.steps_before_block = steps_before_block
        self.seen: list[tuple[Any, bool, str | None]] = []

    def __call__(self, ctx: JobContext) -> Any:
        start = (ctx.checkpoint or {}).get("step", 0)
        self.started.set()
        step = start + self.steps_before_block
        if start:
            return {"resumedFrom": start}
        deadline = time.monotonic() + BOUND_S
        while not ctx.wait_cancelled(0.02):
            assert time.monotonic() < deadline, "never cancelled"
        self.seen.append((ctx.checkpoint, ctx.shutting_down, ctx.cancel_reason))
        ctx.progress({"step": step})
        return {"partial": True}


def test_past_the_finish_window_the_attempt_is_cancelled_and_released_uncharged(
    queue: Queue, engine: Engine
) -> None:
    handler = Checkpointing()
    registry = registry_of({"test-shutdown": handler})
    job = enqueue(queue, "test-shutdown", max_attempts=1)
    shutdown = Shutdown()
    box: dict[str, Any] = {}
    t = threading.Thread(
        target=lambda: box.update(r=run_attempt(queue, LEASE_3S, registry, job.id, 1, shutdown=shutdown))
    )
    t.start()
    assert handler.started.wait(BOUND_S)
    began = time.monotonic()
    shutdown.begin(GRACE_MS)
    t.join(BOUND_S)
    took = time.monotonic() - began
    assert not t.is_alive()
    result = box["r"]
    assert result.status == "released" and result.job.status == "queued"
    assert took < GRACE_MS / 1000  # the whole hand-back fits inside the grace
    assert handler.seen == [(None, True, "shutdown")]
    rs = receipts_of(engine, job.id)
    assert [r.type for r in rs][-2:] == ["job.progress", "job.released"]
    assert rs[-1].body == {"workerId": rs[1].body["workerId"], "attempt": 1, "reason": "shutdown"}
    assert (result.job.attempt, result.job.released, result.job.lease) == (1, 1, None)
    # maxAttempts 1 and one attempt used, yet the next worker runs it: the release was not charged,
    # and it resumes from the checkpoint the stopped attempt saved.
    nxt = run_attempt(queue, LEASE_3S, registry, job.id, 2, shutdown=Shutdown())
    assert nxt.status == "completed" and nxt.job is not None
    assert nxt.job.result == {"resumedFrom": 3}


def test_an_attempt_that_finishes_inside_the_finish_window_settles_normally(
    queue: Queue, engine: Engine
) -> None:
    go = threading.Event()

    def handler(ctx: JobContext) -> Any:
        assert go.wait(BOUND_S)
        return {"done": True}

    job = enqueue(queue, "test-finish")
    shutdown = Shutdown()
    box: dict[str, Any] = {}
    t = threading.Thread(
        target=lambda: box.update(
            r=run_attempt(
                queue, LEASE_3S, registry_of({"test-finish": handler}), job.id, 1, shutdown=shutdown
            )
        )
    )
    t.start()
    shutdown.begin(20_000)  # a 15 s finish window
    go.set()
    t.join(BOUND_S)
    assert box["r"].status == "completed"
    assert "job.released" not in [r.type for r in receipts_of(engine, job.id)]


def _interrupted(ctx: JobContext) -> Any:
    raise HandlerError("command exited with -15", retryable=True, interrupted=True)


def test_a_command_killed_by_the_platforms_sigterm_during_shutdown_is_handed_back(
    queue: Queue, engine: Engine
) -> None:
    job = enqueue(queue, "test-int", max_attempts=1)
    shutdown = Shutdown()
    shutdown.begin(20_000)
    result = run_attempt(
        queue, LEASE_3S, registry_of({"test-int": _interrupted}), job.id, 1, shutdown=shutdown
    )
    assert result.status == "released" and result.job is not None and result.job.status == "queued"
    assert [r.type for r in receipts_of(engine, job.id)][-1] == "job.released"


def test_the_same_death_without_a_shutdown_is_an_ordinary_failure(queue: Queue) -> None:
    job = enqueue(queue, "test-int", max_attempts=1)
    result = run_attempt(
        queue, LEASE_3S, registry_of({"test-int": _interrupted}), job.id, 1, shutdown=Shutdown()
    )
    assert result.status == "failed" and result.job is not None and result.job.status == "failed"


def test_an_abort_pending_at_release_cancels_instead(queue: Queue) -> None:
    started = threading.Event()

    def handler(ctx: JobContext) -> Any:
        started.set()
        ctx.wait_cancelled(BOUND_S)
        return None

    job = enqueue(queue, "test-abort-release")
    shutdown = Shutdown()
    box: dict[str, Any] = {}
    t = threading.Thread(
        target=lambda: box.update(
            r=run_attempt(
                queue, LEASE_3S, registry_of({"test-abort-release": handler}), job.id, 1, shutdown=shutdown
            )
        )
    )
    t.start()
    assert started.wait(BOUND_S)
    queue.cancel(job.id, "stop it")
    shutdown.begin(0)  # cancel at once: the abort and the shutdown race, the abort must win
    t.join(BOUND_S)
    assert box["r"].job.status == "canceled"


def test_the_retry_backoff_after_a_release_counts_charged_attempts(queue: Queue, engine: Engine) -> None:
    # RECEIPT_RETRY_BACKOFF_MS * 2^(charged - 1): a released attempt adds no step to the backoff.
    settings = Settings.from_env(
        {"RECEIPT_RETRY_BACKOFF_MS": "60000", "RECEIPT_RETRY_BACKOFF_MAX_MS": "600000"}
    )
    handler = Checkpointing()
    registry = registry_of({"test-shutdown": handler})
    job = enqueue(queue, "test-shutdown", max_attempts=3)
    shutdown = Shutdown()
    box: dict[str, Any] = {}
    t = threading.Thread(
        target=lambda: box.update(r=run_attempt(queue, settings, registry, job.id, 1, shutdown=shutdown))
    )
    t.start()
    assert handler.started.wait(BOUND_S)
    shutdown.begin(GRACE_MS)
    t.join(BOUND_S)
    assert box["r"].status == "released"

    def fails(ctx: JobContext) -> Any:
        raise HandlerError("boom", retryable=True)

    out = run_attempt(queue, settings, registry_of({"test-shutdown": fails}), job.id, 2, shutdown=Shutdown())
    assert out.job is not None and out.job.status == "queued" and out.job.charged_attempts == 1
    failed = receipts_of(engine, job.id)[-1]
    assert failed.type == "job.failed"
    assert failed.body["retryAt"] is not None
    retry_at, failed_at = parse_iso(failed.body["retryAt"]), parse_iso(failed.at)
    assert retry_at is not None and failed_at is not None
    waited = retry_at - failed_at
    # The first charged attempt's delay (60 s), not the second's (120 s).
    assert timedelta(seconds=55) < waited < timedelta(seconds=65), waited
