"""One attempt of one job, on every backend (spec: "Worker executes and settles", "Failure statuses").

``run_attempt`` is Celery-free, so these drive it directly with test handlers, real receipts and
the real clock. Durations are the spec's own: a 3 000 ms lease gives the 5 000 ms execution
timeout floor and the 1 000 ms heartbeat floor.
"""

from __future__ import annotations

import functools
import threading
import time
from typing import Any

import pytest
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, OperationalError

from app.config import Settings
from app.jobs.errors import no_handler_message
from app.jobs.timing import EXECUTION_TIMEOUT_FLOOR_MS
from app.storage import retry as retry_module
from app.storage.queue import Queue
from tests.support.queue_ops import lease
from workers import runner
from workers.handler import HandlerError, JobContext
from workers.runner import run_attempt

from .runtime_support import enqueue, receipts_of, registry_of, types_of, wait_lease_past_deadline, wait_until

pytestmark = pytest.mark.one_backend  # the rules above the queue: PostgreSQL alone

LEASE_3S = Settings.from_env({"JOB_LEASE_MS": "3000", "RECEIPT_RESONATE_HEARTBEAT_INTERVAL_MS": "1000"})
WAIT_S = 10.0


def ok_handler(ctx: JobContext) -> Any:
    return {"ok": True, "agent": ctx.job.agent_id}


class Blocking:
    """A handler that reports it started, then waits for cancellation (bounded) or a release."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()
        self.ctx: JobContext | None = None
        self.saw_cancel: str | None = None
        self.finished = threading.Event()

    def __call__(self, ctx: JobContext) -> Any:
        self.ctx = ctx
        self.started.set()
        deadline = time.monotonic() + WAIT_S * 2
        try:
            while time.monotonic() < deadline:
                if ctx.wait_cancelled(0.02):
                    self.saw_cancel = ctx.cancel_reason
                    return {"stopped": ctx.cancel_reason}
                if self.release.is_set():
                    return {"released": True}
            raise AssertionError("handler was never cancelled nor released")
        finally:
            self.finished.set()


def in_thread(fn: Any, *args: Any, **kwargs: Any) -> tuple[threading.Thread, dict[str, Any]]:
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["result"] = fn(*args, **kwargs)
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def joined(t: threading.Thread, box: dict[str, Any], timeout: float = WAIT_S) -> Any:
    t.join(timeout)
    assert not t.is_alive(), "run_attempt did not return in time"
    if "error" in box:
        raise box["error"]
    return box["result"]


def test_completes_with_leased_then_heartbeat_then_completed(queue: Queue, engine: Engine) -> None:
    job = enqueue(queue, "test-ok")
    result = run_attempt(queue, LEASE_3S, registry_of({"test-ok": ok_handler}), job.id, 1)
    assert result.status == "completed"
    assert result.job is not None and result.job.status == "completed"
    assert result.job.result == {"ok": True, "agent": "test-ok"}
    rs = receipts_of(engine, job.id)
    assert [r.type for r in rs] == ["job.enqueued", "job.leased", "job.heartbeat", "job.completed"]
    # The start-fence heartbeat is the lease holder's own: it is what promotes leased -> running.
    leased, beat, done = rs[1].body, rs[2].body, rs[3].body
    assert leased["attempt"] == beat["attempt"] == done["attempt"] == 1
    assert leased["workerId"] == beat["workerId"] == done["workerId"]


def test_heartbeat_promotes_leased_to_running_before_the_handler_runs(queue: Queue) -> None:
    seen: list[str] = []

    def handler(ctx: JobContext) -> Any:
        current = queue.get(ctx.job.id)
        assert current is not None
        seen.append(current.status)
        return None

    job = enqueue(queue, "test-status")
    assert (
        run_attempt(queue, LEASE_3S, registry_of({"test-status": handler}), job.id, 1).status == "completed"
    )
    assert seen == ["running"]


def test_handler_reports_progress_and_consumes_commands(queue: Queue, engine: Engine) -> None:
    job = enqueue(queue, "test-steer")
    queue.command(job.id, "steer", payload={"text": "go left"})
    queue.command(job.id, "follow_up", payload={"text": "then right"})

    def handler(ctx: JobContext) -> Any:
        assert ctx.progress({"step": 1}) is True
        commands = ctx.commands()
        for c in commands:
            ctx.consume(c)
        assert ctx.commands() == []
        return {"seen": [[c.type, c.payload["text"]] for c in commands]}

    result = run_attempt(queue, LEASE_3S, registry_of({"test-steer": handler}), job.id, 1)
    assert result.status == "completed"
    assert result.job is not None
    assert result.job.result == {"seen": [["steer", "go left"], ["follow_up", "then right"]]}
    assert result.job.progress == {"step": 1}
    assert result.job.pending_commands == ()
    types = types_of(engine, job.id)
    assert types.count("queue.command.consumed") == 2
    assert types.index("job.progress") < types.index("job.completed")


def test_retryable_handler_error_requeues_and_keeps_status_out_of_result(queue: Queue) -> None:
    def handler(ctx: JobContext) -> Any:
        raise HandlerError("upstream 503", retryable=True, status="failed", result={"partial": 1})

    job = enqueue(queue, "test-flaky", max_attempts=2)
    result = run_attempt(queue, LEASE_3S, registry_of({"test-flaky": handler}), job.id, 1)
    # The worker's return value carries the status; the receipt only records the error and requeues.
    assert (result.status, result.error) == ("failed", "upstream 503")
    assert result.job is not None
    assert (result.job.status, result.job.attempt, result.job.error) == ("queued", 1, "upstream 503")
    assert result.job.result is None


def test_non_retryable_handler_error_fails_with_status_on_result(queue: Queue) -> None:
    def handler(ctx: JobContext) -> Any:
        raise HandlerError("bad input", retryable=False, status="failed", result={"field": "x"})

    job = enqueue(queue, "test-bad", max_attempts=3)
    result = run_attempt(queue, LEASE_3S, registry_of({"test-bad": handler}), job.id, 1)
    assert result.status == "failed"
    assert result.job is not None
    assert (result.job.status, result.job.attempt, result.job.error) == ("failed", 1, "bad input")
    assert result.job.result == {"field": "x", "status": "failed"}


def test_a_secret_quoted_in_a_failure_is_hidden_before_the_receipt_stores_it(queue: Queue) -> None:
    settings = Settings.from_env(
        {
            "JOB_LEASE_MS": "3000",
            "RECEIPT_INTEGRATION_PUBLISH_URL": "https://ci.example/publish?token=tok-8a2b",
            "RECEIPT_CALLBACK_SECRET": "whsec_sig-8a2b",
        }
    )

    def quoting(ctx: JobContext) -> Any:
        raise HandlerError("POST /publish?token=tok-8a2b failed", retryable=False)

    def raising(ctx: JobContext) -> Any:
        raise RuntimeError("signing with whsec_sig-8a2b failed")

    for handler, expected in (
        (quoting, "POST /publish?*** failed"),
        (raising, "RuntimeError: signing with *** failed"),
    ):
        job = enqueue(queue, "test-leaky", max_attempts=1)
        result = run_attempt(queue, settings, registry_of({"test-leaky": handler}), job.id, 1)
        assert result.job is not None and result.job.status == "failed"
        assert (result.error, result.job.error) == (expected, expected)


def test_retryable_error_on_the_last_attempt_fails_with_status(queue: Queue) -> None:
    def handler(ctx: JobContext) -> Any:
        raise HandlerError("still down", retryable=True)

    job = enqueue(queue, "test-flaky", max_attempts=1)
    result = run_attempt(queue, LEASE_3S, registry_of({"test-flaky": handler}), job.id, 1)
    assert result.job is not None
    assert (result.job.status, result.job.result) == ("failed", {"status": "failed"})


def test_unexpected_exception_is_a_retryable_failure(queue: Queue) -> None:
    def handler(ctx: JobContext) -> Any:
        raise RuntimeError("boom")

    job = enqueue(queue, "test-crash", max_attempts=2)
    result = run_attempt(queue, LEASE_3S, registry_of({"test-crash": handler}), job.id, 1)
    assert result.job is not None
    assert (result.job.status, result.job.error) == ("queued", "RuntimeError: boom")


def test_unknown_agent_fails_non_retryably_with_the_exact_message(queue: Queue) -> None:
    job = enqueue(queue, "nobody-home", max_attempts=8)
    result = run_attempt(queue, LEASE_3S, registry_of({}), job.id, 1)
    assert result.status == "failed"
    assert result.job is not None
    assert result.job.status == "failed"
    assert result.job.error == no_handler_message("nobody-home") == "No handler for agent 'nobody-home'"
    assert result.job.attempt == 1  # not retried although 8 attempts were allowed
    assert result.job.result == {"status": "failed"}


def test_abort_requested_before_start_cancels_without_running_the_handler(
    queue: Queue, engine: Engine
) -> None:
    called = threading.Event()

    def handler(ctx: JobContext) -> Any:
        called.set()

    job = enqueue(queue, "test-abort")
    queue.command(job.id, "abort", reason="changed my mind")
    result = run_attempt(queue, LEASE_3S, registry_of({"test-abort": handler}), job.id, 1)
    assert result.status == "canceled"
    assert not called.is_set()
    assert result.job is not None
    assert (result.job.status, result.job.error) == ("canceled", "changed my mind")
    assert types_of(engine, job.id)[-1] == "job.canceled"


def test_redelivered_work_with_abort_cancels_under_the_start_fence(queue: Queue) -> None:
    called = threading.Event()
    job = enqueue(queue, "test-abort")
    assert lease(queue, job.id, "w-redelivered", 3000).applied
    queue.cancel(job.id, "stop it")  # leased -> an abort command, not an outright cancel
    result = run_attempt(
        queue,
        LEASE_3S,
        registry_of({"test-abort": lambda ctx: called.set()}),
        job.id,
        1,
        worker_id="w-redelivered",
    )
    assert result.status == "canceled"
    assert not called.is_set()
    assert result.job is not None and result.job.status == "canceled"


def test_abort_while_running_signals_the_handler_and_cancels(queue: Queue, engine: Engine) -> None:
    handler = Blocking()
    job = enqueue(queue, "test-long")
    t, box = in_thread(run_attempt, queue, LEASE_3S, registry_of({"test-long": handler}), job.id, 1)
    assert handler.started.wait(WAIT_S)
    queue.cancel(job.id, "user pressed stop")
    result = joined(t, box)
    assert result.status == "canceled"
    assert handler.saw_cancel == "user pressed stop"
    assert result.job is not None
    assert (result.job.status, result.job.error) == ("canceled", "user pressed stop")
    assert "job.completed" not in types_of(engine, job.id)


def test_execution_timeout_fails_with_status_execution_timeout(queue: Queue, engine: Engine) -> None:
    """Spec floor: a 3 000 ms lease gives max(5 000, 3 000 - 1 000) = 5 000 ms to run."""
    handler = Blocking()
    job = enqueue(queue, "test-stuck", max_attempts=1)
    started = time.monotonic()
    result = run_attempt(queue, LEASE_3S, registry_of({"test-stuck": handler}), job.id, 1)
    elapsed = time.monotonic() - started
    assert result.status == "execution_timeout"
    assert handler.saw_cancel == "execution_timeout"
    # Never before the floor; load can only make it later, so the ceiling is a generous bound.
    assert EXECUTION_TIMEOUT_FLOOR_MS / 1000 <= elapsed < EXECUTION_TIMEOUT_FLOOR_MS / 1000 + 30
    assert result.job is not None
    assert result.job.status == "failed"
    assert result.job.result == {"status": "execution_timeout"}
    assert result.job.error == "execution timed out after 5000 ms"
    # The lease stayed alive while the handler ran: the start fence plus 1 s heartbeats over 5 s
    # (at least two of those four even on a starved machine).
    assert types_of(engine, job.id).count("job.heartbeat") >= 3


def test_duplicate_delivery_after_completion_is_terminal_state_and_writes_nothing(
    queue: Queue,
    engine: Engine,
) -> None:
    registry = registry_of({"test-ok": ok_handler})
    job = enqueue(queue, "test-ok")
    assert run_attempt(queue, LEASE_3S, registry, job.id, 1).status == "completed"
    before = len(receipts_of(engine, job.id))
    again = run_attempt(queue, LEASE_3S, registry, job.id, 1)
    assert again.status == "terminal_state"
    assert len(receipts_of(engine, job.id)) == before


def test_concurrent_duplicate_of_a_running_fence_is_lease_lost_and_inert(
    queue: Queue, engine: Engine
) -> None:
    handler = Blocking()
    calls = []

    def counting(ctx: JobContext) -> Any:
        calls.append(ctx.worker_id)
        return handler(ctx)

    registry = registry_of({"test-long": counting})
    job = enqueue(queue, "test-long")
    t, box = in_thread(run_attempt, queue, LEASE_3S, registry, job.id, 1, worker_id="first")
    assert handler.started.wait(WAIT_S)
    duplicate = run_attempt(queue, LEASE_3S, registry, job.id, 1, worker_id="duplicate")
    assert duplicate.status == "lease_lost"
    handler.release.set()
    assert joined(t, box).status == "completed"
    assert calls == ["first"]
    for r in receipts_of(engine, job.id):
        assert r.body.get("workerId") != "duplicate", r.type


def test_stale_fence_is_stale_attempt(queue: Queue, engine: Engine) -> None:
    registry = registry_of({"test-flaky": lambda ctx: (_ for _ in ()).throw(HandlerError("again"))})
    job = enqueue(queue, "test-flaky", max_attempts=3)
    # A fence from the future: the job is queued for attempt 1.
    assert run_attempt(queue, LEASE_3S, registry, job.id, 2).status == "stale_attempt"
    assert run_attempt(queue, LEASE_3S, registry, job.id, 1).status == "failed"  # requeued, attempt 1 used
    before = len(receipts_of(engine, job.id))
    # A redelivery of the superseded attempt-1 message: the job now waits for attempt 2.
    stale = run_attempt(queue, LEASE_3S, registry, job.id, 1)
    assert stale.status == "stale_attempt"
    assert len(receipts_of(engine, job.id)) == before
    assert run_attempt(queue, LEASE_3S, registry, "no-such-job", 1).status == "stale_attempt"


def test_lease_lost_while_running_signals_the_handler(queue: Queue, engine: Engine) -> None:
    """A 300 ms lease expires long before the 1 000 ms heartbeat (floor), which then finds it gone."""
    settings = Settings.from_env({"JOB_LEASE_MS": "300"})
    handler = Blocking()
    job = enqueue(queue, "test-long")
    t, box = in_thread(run_attempt, queue, settings, registry_of({"test-long": handler}), job.id, 1)
    assert handler.started.wait(WAIT_S)
    wait_lease_past_deadline(engine, queue, job.id)
    # The worker's next heartbeat (1 s floor) may renew the 300 ms lease first on a busy machine;
    # the lease is past its deadline for ~700 ms of every second, so keep trying (bounded).
    wait_until(lambda: queue.expire_lease(job.id).applied, what="the lease to be expired")
    result = joined(t, box)
    assert result.status == "lease_lost"
    assert handler.finished.wait(WAIT_S)
    assert handler.saw_cancel == "lease_lost"
    types = types_of(engine, job.id)
    assert "job.lease_expired" in types
    assert "job.completed" not in types and "job.canceled" not in types
    current = queue.get(job.id)
    assert current is not None and current.status == "queued"


# -- settlement storage retries: 5 attempts, 150 ms x attempt, transient errors only -------------


def _transient() -> OperationalError:
    return OperationalError("COMMIT", {}, Exception("server closed the connection unexpectedly"))


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    sleeps: list[float] = []
    monkeypatch.setattr(
        runner, "retry_transient", functools.partial(retry_module.retry_transient, sleep=sleeps.append)
    )
    return sleeps


def _failing_complete(queue: Queue, errors: list[BaseException]) -> list[int]:
    real = queue.settle_attempt
    calls: list[int] = []

    def settle_attempt(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if errors:
            raise errors.pop(0)
        return real(*args, **kwargs)

    queue.settle_attempt = settle_attempt  # type: ignore[method-assign]
    return calls


def test_settlement_retries_transient_storage_errors_with_backoff(queue: Queue, slept: list[float]) -> None:
    job = enqueue(queue, "test-ok")
    calls = _failing_complete(queue, [_transient(), _transient()])
    result = run_attempt(queue, LEASE_3S, registry_of({"test-ok": ok_handler}), job.id, 1)
    assert result.status == "completed"
    assert len(calls) == 3
    assert slept == pytest.approx([0.15, 0.30])


def test_settlement_gives_up_after_five_transient_attempts(queue: Queue, slept: list[float]) -> None:
    job = enqueue(queue, "test-ok")
    calls = _failing_complete(queue, [_transient() for _ in range(10)])
    with pytest.raises(OperationalError):
        run_attempt(queue, LEASE_3S, registry_of({"test-ok": ok_handler}), job.id, 1)
    assert len(calls) == 5
    assert slept == pytest.approx([0.15, 0.30, 0.45, 0.60])


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(ValueError("bug"), id="programming-error"),
        pytest.param(IntegrityError("INSERT", {}, Exception("duplicate key")), id="integrity-error"),
    ],
)
def test_settlement_does_not_retry_non_transient_errors(
    queue: Queue, slept: list[float], error: BaseException
) -> None:
    job = enqueue(queue, "test-ok")
    calls = _failing_complete(queue, [error])
    with pytest.raises(type(error)):
        run_attempt(queue, LEASE_3S, registry_of({"test-ok": ok_handler}), job.id, 1)
    assert len(calls) == 1
    assert slept == []
    current = queue.get(job.id)
    assert current is not None and current.status == "running"  # left for lease expiry to recover


def test_wait_until_helper_times_out() -> None:
    with pytest.raises(AssertionError, match="timed out"):
        wait_until(lambda: False, timeout=0.05)
