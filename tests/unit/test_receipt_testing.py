"""``receipt.testing`` as a user of Receipt drives it: handlers tested in-process, no servers."""

from __future__ import annotations

import itertools
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from app.jobs.errors import ValidationError, no_handler_message
from app.jobs.timing import retry_delay_ms
from receipt.testing import Clock, HandlerError, InlineRuntime, JobContext
from tests.support.databases import assert_projection_equals_fold
from workers import runner


def greet(ctx: JobContext) -> Any:
    return {"hello": ctx.payload["name"], "attempt": ctx.attempt}


def flaky(ctx: JobContext) -> Any:
    """Fails its first attempt retryably, completes the next."""
    if ctx.attempt == 1:
        raise HandlerError("upstream timed out", retryable=True)
    return {"ok": ctx.attempt}


def refuses(ctx: JobContext) -> Any:
    raise HandlerError(f"bad address {ctx.payload['to']}", retryable=False)


def checkpointed(ctx: JobContext) -> Any:
    """Reports a checkpoint, then waits for cancellation; says what it saw before it returns."""
    ctx.progress({"checkpoint": 1})
    if ctx.wait_cancelled(30):
        ctx.progress({"sawCancel": ctx.cancel_reason})
        return {"stopped": ctx.cancel_reason}
    return {"stopped": None}


def steered(ctx: JobContext) -> Any:
    """Waits for one queue command, consumes it, completes with what it said."""
    ctx.progress({"ready": True})
    while not ctx.wait_cancelled(0.01):
        for command in ctx.commands():
            ctx.consume(command)
            return {"type": command.type, "lane": command.lane, "payload": command.payload}
    return {"stopped": ctx.cancel_reason}


@pytest.fixture
def rt() -> Any:
    with InlineRuntime(
        {"greeter": greet, "flaky": flaky, "mailer": refuses, "long": checkpointed, "steered": steered}
    ) as runtime:
        yield runtime


def test_enqueue_assert_and_drain_through_the_real_worker_path(rt: InlineRuntime) -> None:
    enqueued = rt.enqueue("greeter", {"name": "Ada"}, jobId="greet-1")
    assert enqueued.id == "test-org/greet-1" and enqueued.status == "queued"
    found = rt.assert_enqueued("greeter", kind="factory.run", payload={"name": "Ada"})
    assert found.id == enqueued.id
    rt.refute_enqueued("greeter", payload={"name": "Bob"})

    [ran] = rt.drain()

    assert (ran.job_id, ran.attempt, ran.status) == ("test-org/greet-1", 1, "completed")
    assert ran.job is not None and ran.job.result == {"hello": "Ada", "attempt": 1}
    assert rt.job("greet-1").status == "completed"
    assert rt.types("greet-1") == ["job.enqueued", "job.leased", "job.heartbeat", "job.completed"]
    receipts = rt.receipts("greet-1")
    assert [r.seq for r in receipts] == [1, 2, 3, 4]
    assert all(b.prev_hash == a.hash for a, b in itertools.pairwise(receipts))
    assert_projection_equals_fold(rt.queue.engine, "test-org/greet-1")
    rt.refute_enqueued("greeter")
    assert rt.drain() == []


def test_assertions_fail_with_what_is_there(rt: InlineRuntime) -> None:
    rt.enqueue("greeter", {"name": "Ada", "meta": {"lang": "en", "tz": "UTC"}})
    rt.assert_enqueued(payload={"meta": {"lang": "en"}})
    with pytest.raises(AssertionError, match=r"found 0; jobs: \[\('greeter'"):
        rt.assert_enqueued("greeter", payload={"meta": {"lang": "fr"}})
    with pytest.raises(AssertionError, match="expected no matching job"):
        rt.refute_enqueued("greeter")
    rt.enqueue("greeter", {"name": "Bob"})
    with pytest.raises(AssertionError, match="found 2"):
        rt.assert_enqueued("greeter")


def test_an_invalid_enqueue_is_refused_as_the_api_refuses_it(rt: InlineRuntime) -> None:
    with pytest.raises(ValidationError) as refused:
        rt.enqueue("greeter", {"name": "Ada"}, maxAttempts="three")
    assert refused.value.field == "maxAttempts"
    with pytest.raises(ValidationError) as unknown:
        rt.enqueue("greeter", {"name": "Ada"}, kind="mail.send")
    assert unknown.value.field == "payload.kind"
    assert rt.jobs() == []


def test_a_delayed_job_waits_for_the_clock() -> None:
    with InlineRuntime({"greeter": greet}, clock=Clock(datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC))) as rt:
        job = rt.enqueue("greeter", {"name": "Ada"}, delayMs=60_000)
        assert job.available_at == "2030-01-02T03:05:05.000000Z"
        assert rt.drain() == []
        rt.clock.advance(ms=59_999)
        assert rt.drain() == []
        rt.clock.advance(ms=1)
        [ran] = rt.drain()
        assert ran.status == "completed"
        # Every receipt carries the runtime's clock, not the host's.
        assert [r.at for r in rt.receipts(job.id)] == [
            "2030-01-02T03:04:05.000000Z",
            *["2030-01-02T03:05:05.000000Z"] * 3,
        ]


def test_a_retry_backs_off_on_the_clock_then_runs(rt: InlineRuntime) -> None:
    job = rt.enqueue("flaky", {}, maxAttempts=2)
    [first] = rt.drain()
    assert (first.attempt, first.status, first.error) == (1, "failed", "upstream timed out")
    backing_off = rt.job(job.id)
    assert backing_off.status == "queued" and backing_off.available_at is not None
    assert rt.drain() == []  # not due before its backoff ends

    rt.clock.advance(ms=retry_delay_ms(1, rt.settings))
    [second] = rt.drain()
    assert (second.attempt, second.status) == (2, "completed")
    assert rt.job(job.id).result == {"ok": 2}
    assert rt.types(job.id).count("job.failed") == 1
    assert_projection_equals_fold(rt.queue.engine, job.id)


def test_a_non_retryable_failure_ends_the_job(rt: InlineRuntime) -> None:
    job = rt.enqueue("mailer", {"to": "nowhere"}, maxAttempts=3)
    [ran] = rt.drain()
    assert ran.status == "failed" and ran.error == "bad address nowhere"
    assert rt.job(job.id).status == "failed"
    assert rt.drain() == []


def test_an_agent_without_a_handler_fails_as_a_worker_fails_it(rt: InlineRuntime) -> None:
    job = rt.enqueue("nobody", {})
    [ran] = rt.drain()
    assert ran.status == "failed" and ran.error == no_handler_message("nobody")
    assert rt.job(job.id).status == "failed"


def test_cancelling_a_running_job_reaches_the_handlers_checkpoint(rt: InlineRuntime) -> None:
    job = rt.enqueue("long", {})
    running = rt.start(job.id)
    running.wait_for(lambda j: j.status == "running" and j.progress == {"checkpoint": 1})

    after = rt.cancel(job.id, "user asked")
    assert after.abort_requested and after.status == "running"
    ran = running.wait()

    assert ran.status == "canceled"
    final = rt.job(job.id)
    assert final.status == "canceled" and final.progress == {"sawCancel": "user asked"}
    assert rt.types(job.id)[-1] == "job.canceled"


def test_cancelling_a_queued_job_never_runs_it(rt: InlineRuntime) -> None:
    job = rt.enqueue("greeter", {"name": "Ada"})
    assert rt.cancel(job.id).status == "canceled"
    assert rt.drain() == []
    assert "job.leased" not in rt.types(job.id)


def test_a_running_handler_reads_a_steer_command(rt: InlineRuntime) -> None:
    job = rt.enqueue("steered", {})
    running = rt.start(job.id)
    running.wait_for(lambda j: j.progress == {"ready": True})
    rt.command(job.id, "steer", {"say": "faster"})
    ran = running.wait()
    assert ran.status == "completed"
    assert rt.job(job.id).result == {"type": "steer", "lane": "steer", "payload": {"say": "faster"}}
    assert "queue.command.consumed" in rt.types(job.id)


def test_jobs_a_handler_enqueues_run_in_the_same_drain() -> None:
    def parent(ctx: JobContext) -> Any:
        child = runtime.enqueue("child", {"from": ctx.job.client_id})
        return {"child": child.client_id}

    def child(ctx: JobContext) -> Any:
        return {"parent": ctx.payload["from"]}

    with InlineRuntime({"parent": parent, "child": child}) as runtime:
        runtime.enqueue("parent", {}, jobId="p")
        ran = runtime.drain()
        assert [(r.job_id.split("/")[1] == "p", r.status) for r in ran] == [
            (True, "completed"),
            (False, "completed"),
        ]
        kid = runtime.assert_enqueued("child", status="completed")
        assert kid.result == {"parent": "p"}


def test_handler_modules_load_as_the_workers_load_them() -> None:
    with InlineRuntime(handler_modules=["devharness.handlers"]) as runtime:
        job = runtime.enqueue("e2e-echo", {"message": "hi"})
        [ran] = runtime.drain()
        assert ran.status == "completed" and runtime.job(job.id).result["echo"] == "hi"


def test_the_clock_moves_only_forward() -> None:
    clock = Clock()
    now = clock.now()
    assert clock.advance(seconds=1.5) == now + timedelta(seconds=1.5)
    with pytest.raises(ValueError, match="only moves forward"):
        clock.advance(ms=-1)
    with pytest.raises(ValueError, match="only moves forward"):
        clock.set(now)
    clock.set(now + timedelta(hours=1))
    assert clock() == now + timedelta(hours=1)


def test_each_runtime_has_its_own_database() -> None:
    with InlineRuntime({"greeter": greet}) as one, InlineRuntime({"greeter": greet}) as two:
        one.enqueue("greeter", {"name": "Ada"})
        assert len(one.jobs()) == 1 and two.jobs() == []
        folder = one._dir
    assert not folder.exists()


@pytest.mark.parametrize(
    ("path", "section"), [("README.md", "## Testing your handlers"), ("docs/testing.md", "")]
)
def test_the_documented_example_runs_as_written(path: str, section: str) -> None:
    text = (Path(__file__).resolve().parents[2] / path).read_text()
    if section:
        text = text.split(f"\n{section}\n", 1)[1].split("\n## ", 1)[0]
    first = re.search(r"^```python\n(.*?)^```$", text, flags=re.MULTILINE | re.DOTALL)
    assert first is not None, f"{path}: no python example"
    namespace: dict[str, Any] = {}
    exec(compile(first.group(1), path, "exec"), namespace)
    tests = [fn for name, fn in namespace.items() if name.startswith("test_")]
    assert tests, f"{path}: the example defines no test"
    for test in tests:
        test()


def test_cancel_reaches_a_handler_loaded_from_a_module_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # The worker's own abort poll (and its heartbeat, every 100 s here) would come too late for the
    # bounded wait below: only the runtime's immediate signal can stop the handler in time.
    monkeypatch.setattr(runner, "ABORT_POLL_S", 3600.0)
    with InlineRuntime(handler_modules=["devharness.handlers"]) as runtime:
        job = runtime.enqueue("e2e-wait-cancel", {"seconds": 60})
        running = runtime.start(job.id)
        running.wait_for(lambda j: j.status == "running")
        runtime.cancel(job.id, "stop")
        assert running.wait(timeout=20).status == "canceled"
        assert runtime.job(job.id).progress["sawCancel"] == "stop"
