"""Worker liveness: the pure rules (app/jobs/liveness.py) and one process's self-fence
(workers/liveness.py) on SQLite with a hand-driven clock."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import update
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.config import Settings
from app.jobs import liveness as rules
from app.jobs.reducer import Job
from app.jobs.validation import validate_enqueue
from app.jobs.vocab import job_stream
from app.storage import liveness as records
from app.storage import store
from app.storage.db import worker_liveness
from tests.support.queue_ops import lease
from workers import liveness
from workers.handler import JobContext
from workers.registry import HandlerRegistry
from workers.runner import run_attempt

NOW = datetime(2026, 12, 1, 12, 0, 0, tzinfo=UTC)
BODY = {"payload": {"kind": "factory.run", "authContext": {"userId": "u", "organizationId": "o"}}}


# -- the ordering of the three settings ----------------------------------------------------------------


def test_the_defaults_keep_the_margin_and_the_margin_is_the_sum_written_down() -> None:
    s = Settings()
    assert (
        rules.ordering_errors(s.worker_liveness_interval_ms, s.worker_self_fence_ms, s.worker_dead_after_ms)
        == []
    )
    assert (
        rules.FENCE_MARGIN_MS
        == rules.FENCE_CHECK_MS + rules.KILL_BUDGET_MS + rules.SCHEDULING_SLACK_MS
        == 2000
    )
    assert s.worker_dead_after_ms - s.worker_self_fence_ms >= rules.FENCE_MARGIN_MS


@pytest.mark.parametrize(
    ("interval", "fence", "dead", "names"),
    [
        (2000, 6000, 8000, ["RECEIPT_WORKER_DEAD_AFTER_MS=8000"]),
        (
            2000,
            6000,
            7999,
            ["RECEIPT_WORKER_DEAD_AFTER_MS=7999 must be at least RECEIPT_WORKER_SELF_FENCE_MS=6000"],
        ),
        (2000, 3999, 10000, ["RECEIPT_WORKER_SELF_FENCE_MS=3999 must be at least 2 renewals"]),
        (0, 6000, 10000, ["RECEIPT_WORKER_LIVENESS_INTERVAL_MS=0 must be more than 0"]),
        (2000, 10000, 10000, ["RECEIPT_WORKER_DEAD_AFTER_MS=10000 must be at least"]),
    ],
)
def test_thresholds_out_of_order_are_named(interval: int, fence: int, dead: int, names: list[str]) -> None:
    errors = rules.ordering_errors(interval, fence, dead)
    if dead == 8000:  # exactly self-fence + margin: allowed
        assert errors == []
        return
    assert len(errors) == len(names)
    for error, name in zip(errors, names, strict=True):
        assert name in error


def test_fence_is_due_once_the_self_fence_has_passed_since_the_last_good_renewal_started() -> None:
    assert not rules.fence_due(100.0, 105.999, 6000)
    assert rules.fence_due(100.0, 106.0, 6000)


def test_a_record_lapses_strictly_after_dead_after() -> None:
    assert not rules.lapsed(NOW, NOW + timedelta(milliseconds=10_000), 10_000)
    assert rules.lapsed(NOW, NOW + timedelta(milliseconds=10_001), 10_000)
    assert rules.lapsed_before(NOW, 10_000) == NOW - timedelta(seconds=10)


def _leased(worker_id: str, status: str = "running") -> Job:
    return Job.from_json(
        {
            "id": "j1",
            "agentId": "factory",
            "lane": "main",
            "singletonMode": "none",
            "abortRequested": False,
            "status": status,
            "payload": {"kind": "factory.run"},
            "attempt": 1,
            "maxAttempts": 2,
            "lease": {"workerId": worker_id, "attempt": 1, "expiresAt": "2026-12-01T12:07:00.000Z"},
        }
    )


def test_a_dead_process_expires_only_the_leases_it_holds_with_the_reason() -> None:
    process = rules.process_id("host:42", "0badcafe")
    mine = _leased(rules.holder_id(process, "12345678"))
    events = rules.expire_held(mine, process, NOW)
    assert events == [
        (
            "job.lease_expired",
            {
                "workerId": "host:42:0badcafe12345678",
                "attempt": 1,
                "expiresAt": "2026-12-01T12:07:00.000Z",
                "error": "worker host:42:0badcafe liveness lapsed",
            },
        )
    ]
    assert rules.expire_held(_leased("host:42:0badcaff12345678"), process, NOW) == []  # another epoch
    assert rules.expire_held(_leased("host:421:0badcafe1234567"), process, NOW) == []
    assert rules.expire_held(_leased(rules.holder_id(process, "1"), status="queued"), process, NOW) == []


# -- one process's liveness ---------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _process(engine: Engine, clock: Clock) -> liveness.ProcessLiveness:
    return liveness.ProcessLiveness(engine, Settings(), "worker-codex", clock=clock, base="host:42")


def _ctx(worker_id: str) -> JobContext:
    return JobContext(None, _leased(worker_id), worker_id, 1, Settings(), 1000)  # type: ignore[arg-type]


def test_a_process_that_cannot_renew_fences_itself_at_the_self_fence_and_takes_a_new_identity(
    sqlite_engine: Engine,
) -> None:
    clock = Clock()
    live = _process(sqlite_engine, clock)
    records.register(sqlite_engine, live.process, live.role)
    first = live.process
    ctx = _ctx(live.holder_id())
    assert ctx.worker_id.startswith(first) and len(ctx.worker_id) == len(first) + 8
    live.track(ctx)
    clock.t += 2.0
    live.renew_once()  # renewed: the deadline moves to 1002 + 6
    clock.t = 1007.9
    assert not live.check() and not ctx.cancelled.is_set()
    sqlite_engine.dispose()
    live.engine = _broken_engine()
    clock.t = 1008.0
    live.renew_once()  # fails: nothing changes
    assert not ctx.cancelled.is_set()
    assert live.check()
    assert ctx.cancelled.is_set() and ctx.cancel_reason == rules.FENCED
    assert live.process != first and live.process.startswith("host:42:")
    assert list(live.fences) == [(first, "no liveness renewal for 6000 ms", 1)]
    # An attempt leased under the fenced identity a moment too late is cancelled as it starts ...
    late = _ctx(rules.holder_id(first, "abcdef01"))
    live.track(late)
    assert late.cancel_reason == rules.FENCED
    # ... and one under the new identity runs on, until that identity is fenced in its turn.
    fresh = _ctx(live.holder_id())
    live.track(fresh)
    assert not fresh.cancelled.is_set()
    clock.t += 6.0
    assert live.check() and fresh.cancel_reason == rules.FENCED
    assert [n for _, _, n in live.fences] == [1, 1]


def test_a_process_whose_record_was_declared_dead_fences_at_once(sqlite_engine: Engine) -> None:
    clock = Clock()
    live = _process(sqlite_engine, clock)
    records.register(sqlite_engine, live.process, live.role)
    ctx = _ctx(live.holder_id())
    with sqlite_engine.begin() as conn:
        conn.execute(update(worker_liveness).values(dead_at=NOW))
    live.track(ctx)
    live.renew_once()
    assert ctx.cancel_reason == rules.FENCED
    assert live.fences[0][1] == "its record was declared dead"
    # The new identity is recorded by its first renewal (a missing row is re-inserted).
    live.renew_once()
    assert {r.process_id for r in records.records(sqlite_engine) if r.dead_at is None} == {live.process}


def test_a_clean_stop_deletes_the_record_unless_a_lease_is_held_under_it(sqlite_engine: Engine) -> None:
    live = _process(sqlite_engine, Clock())
    live.start()
    assert [r.process_id for r in records.records(sqlite_engine)] == [live.process]
    live.stop()
    assert records.records(sqlite_engine) == []

    holding = _process(sqlite_engine, Clock())
    holding.start()
    queue = queue_for(sqlite_engine)
    job_id = queue.enqueue(validate_enqueue("factory", BODY)).job.id
    assert lease(queue, job_id, holding.holder_id(), 60_000, start=True).applied
    holding.stop()  # left to lapse: the worker-liveness loop expires the lease it still holds
    assert [r.process_id for r in records.records(sqlite_engine)] == [holding.process]


class _Broken:
    def begin(self) -> Any:
        raise ConnectionError("database unreachable")

    def connect(self) -> Any:
        raise ConnectionError("database unreachable")


def _broken_engine() -> Any:
    return _Broken()


# -- the runner: a fenced attempt writes nothing -----------------------------------------------------


def test_a_fenced_attempt_returns_lease_lost_and_writes_no_settlement(sqlite_engine: Engine) -> None:
    queue = queue_for(sqlite_engine)
    job_id = queue.enqueue(validate_enqueue("factory", BODY)).job.id
    started = threading.Event()
    seen: dict[str, Any] = {}

    def handler(ctx: JobContext) -> Any:
        started.set()
        ctx.wait_cancelled(30)
        seen["reason"] = ctx.cancel_reason
        return {"finished": True}  # what a handler returns after a fence is never recorded

    registry = HandlerRegistry()
    registry.register("factory", handler)
    live = _process(sqlite_engine, Clock())
    records.register(sqlite_engine, live.process, live.role)
    liveness.install(live)
    try:
        box: dict[str, Any] = {}
        t = threading.Thread(
            target=lambda: box.update(out=run_attempt(queue, Settings(), registry, job_id, 1))
        )
        t.start()
        assert started.wait(10)
        live.fence(live.process, "test")
        t.join(10)
        assert not t.is_alive()
    finally:
        liveness.install(None)
    assert box["out"].status == "lease_lost"
    assert seen["reason"] == rules.FENCED
    job = queue.get(job_id)
    assert job is not None and job.status == "running"  # left for the worker-liveness loop
    assert job.lease is not None and job.lease.worker_id.startswith(live.fences[0][0])
    with sqlite_engine.connect() as conn:
        types = [r.type for r in store.read_stream(conn, job_stream(job_id))]
    assert types == ["job.enqueued", "job.leased", "job.heartbeat"]


def test_a_fence_kills_registered_commands_itself_and_a_withdrawn_kill_is_not_called(
    sqlite_engine: Engine,
) -> None:
    # The handler thread may be stuck on the unreachable database: the fence does not wait for it.
    clock = Clock()
    live = _process(sqlite_engine, clock)
    ctx, done = _ctx(live.holder_id()), _ctx(live.holder_id())
    killed: list[str] = []
    live.track(ctx)
    live.track(done)
    live.on_fence(ctx, lambda: killed.append("running"))
    withdraw = live.on_fence(done, lambda: killed.append("ended"))
    withdraw()  # its command ended: the handler withdrew the kill
    clock.t += 6.0
    assert live.check()
    assert killed == ["running"]
    assert ctx.cancel_reason == rules.FENCED
