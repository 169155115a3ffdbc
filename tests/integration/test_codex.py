"""The ``codex`` handler with real subprocesses (argv, never a shell; group kill).

Commands are small ``python3 -c`` scripts. Receipts go to a SQLite file database: the handler's
behaviour does not depend on the backend, and the runner suite already covers both.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import textwrap
import threading
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.config import Settings
from app.jobs.errors import wrong_agent_message
from app.jobs.privilege import Enqueuer
from app.jobs.reducer import Job
from app.jobs.timing import timing_for
from app.storage.queue import Queue
from tests.support.queue_ops import lease
from tests.support.tracing import Spans
from workers import sandbox
from workers.handler import HandlerError, JobContext
from workers.registry import default_registry, dispatch
from workers.runner import run_attempt

from .runtime_support import enqueue, receipts_of, wait_until

ENABLED = Settings.from_env({"RECEIPT_CODEX_COMMANDS": "enabled"})
# A system binary: under the sandbox a command runs as RECEIPT_CODEX_USER, which cannot execute
# anything under /root (where the venv's interpreter lives); see SANDBOX-NOTES.
PY = "/usr/bin/python3"
WAIT_S = 10.0


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder the sandbox user may read and write (pytest's tmp_path is root's, mode 0700)."""
    path = Path(tempfile.mkdtemp(prefix="receipt-test-shared-"))
    path.chmod(0o777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def in_workspace(root: Path, settings: Settings = ENABLED) -> Settings:
    return replace(settings, codex_workspace_root=str(root))


@pytest.fixture
def queue(sqlite_engine: Engine) -> Queue:
    return queue_for(sqlite_engine)


def codex_job(queue: Queue, **payload: Any) -> Job:
    return enqueue(queue, "codex", kind="factory.task.run", **payload)


def leased_context(queue: Queue, job: Job, settings: Settings = ENABLED) -> JobContext:
    """The context a worker would hand the handler: the job leased by this attempt."""
    timing = timing_for(job.agent_id, job.kind, job.payload, settings)
    out = lease(queue, job.id, "codex-worker", timing.lease_ms)
    assert out.applied
    return JobContext(queue, out.job, "codex-worker", 1, settings, timing.execution_timeout_ms)


def marked(marker: str) -> list[int]:
    """Host pids of live processes whose command line carries ``marker``.

    Inside the sandbox's PID namespace a command only knows its own pids, so tests find what it
    started from the outside, by a marker in argv.
    """
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmdline = f.read()
            with open(f"/proc/{entry}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state not in ("Z", "X"):
            found.append(int(entry))
    return found


def family_script(marker: str) -> list[str]:
    """A command that starts a child, then both sleep for a minute; both carry ``marker`` in argv."""
    script = textwrap.dedent("""
        import subprocess, sys, time
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", sys.argv[1]])
        print("family started", flush=True)
        time.sleep(60)
    """)
    return [PY, "-c", script, marker]


def wait_family(marker: str) -> None:
    wait_until(lambda: len(marked(marker)) >= 2, timeout=WAIT_S, what="the command and its child")


def wait_gone(marker: str) -> None:
    wait_until(lambda: not marked(marker), timeout=5, what="every process of the command to be gone")


def test_command_is_an_argv_never_a_shell(queue: Queue, shared_dir: Path) -> None:
    job = codex_job(queue, command=["echo", "a;touch X", "$HOME", "`id`"], cwd=str(shared_dir))
    result = dispatch(leased_context(queue, job, in_workspace(shared_dir)))
    assert result["exitCode"] == 0
    assert result["outputTail"] == "a;touch X $HOME `id`\n"
    assert not (shared_dir / "X").exists()


def test_success_completes_with_exit_code_tail_and_progress_receipts(
    queue: Queue, sqlite_engine: Engine
) -> None:
    job = codex_job(queue, command=[PY, "-c", "print('hello from codex'); print('line 2')"])
    out = run_attempt(queue, ENABLED, default_registry(), job.id, 1)
    assert out.status == "completed"
    assert out.job is not None
    assert out.job.result["exitCode"] == 0
    assert out.job.result["outputTail"] == "hello from codex\nline 2\n"
    assert out.job.result["outputBytes"] == len("hello from codex\nline 2\n")
    progress = [r.body["progress"] for r in receipts_of(sqlite_engine, job.id) if r.type == "job.progress"]
    assert progress, "output must be reported as job.progress"
    assert "".join(p["output"] for p in progress) == "hello from codex\nline 2\n"


def test_cwd_is_honoured(queue: Queue, shared_dir: Path) -> None:
    (shared_dir / "sub").mkdir(mode=0o777)
    job = codex_job(queue, command=[PY, "-c", "import os; print(os.getcwd())"], cwd="sub")
    result = dispatch(leased_context(queue, job, in_workspace(shared_dir)))
    assert result["outputTail"].strip() == str(shared_dir / "sub")


def test_non_zero_exit_is_retryable_with_exit_code_and_tail(queue: Queue) -> None:
    job = codex_job(queue, command=[PY, "-c", "import sys; print('it broke'); sys.exit(3)"])
    with pytest.raises(HandlerError) as info:
        dispatch(leased_context(queue, job))
    err = info.value
    assert err.retryable is True
    assert err.result is not None
    assert err.result["exitCode"] == 3
    assert err.result["outputTail"] == "it broke\n"
    assert "3" in err.message and "it broke" in err.message


def test_non_zero_exit_through_the_runner_requeues_then_fails(queue: Queue) -> None:
    job = enqueue(
        queue, "codex", kind="factory.task.run", max_attempts=1, command=[PY, "-c", "import sys; sys.exit(7)"]
    )
    out = run_attempt(queue, ENABLED, default_registry(), job.id, 1)
    assert out.job is not None and out.job.status == "failed"
    assert out.job.result["exitCode"] == 7
    assert out.job.result["status"] == "failed"


def test_payload_timeout_kills_the_whole_process_group(queue: Queue) -> None:
    marker = f"receipt-test-{uuid.uuid4().hex}"
    job = codex_job(queue, command=family_script(marker), timeout=1500)
    ctx = leased_context(queue, job)
    with pytest.raises(HandlerError) as info:
        dispatch(ctx)
    err = info.value
    assert err.status == "execution_timeout"
    assert err.retryable is True
    assert "1500 ms" in err.message
    assert err.result is not None and err.result["exitCode"] != 0
    assert "family started" in err.result["outputTail"]
    wait_gone(marker)


def test_abort_kills_the_whole_process_group(queue: Queue) -> None:
    marker = f"receipt-test-{uuid.uuid4().hex}"
    job = codex_job(queue, command=family_script(marker))
    ctx = leased_context(queue, job)
    box: dict[str, Any] = {}
    t = threading.Thread(target=lambda: box.update(result=dispatch(ctx)), daemon=True)
    t.start()
    wait_family(marker)
    ctx.cancel("abort")
    t.join(WAIT_S)
    assert not t.is_alive()
    assert box["result"]["exitCode"] != 0  # killed by a signal
    wait_gone(marker)


def test_abort_through_the_runner_cancels_and_kills_the_group(queue: Queue) -> None:
    marker = f"receipt-test-{uuid.uuid4().hex}"
    job = codex_job(queue, command=family_script(marker))
    box: dict[str, Any] = {}
    t = threading.Thread(
        target=lambda: box.update(out=run_attempt(queue, ENABLED, default_registry(), job.id, 1)), daemon=True
    )
    t.start()
    wait_family(marker)
    queue.cancel(job.id, "stop the build")
    t.join(WAIT_S)
    assert not t.is_alive()
    assert box["out"].status == "canceled"
    assert box["out"].job.status == "canceled"
    wait_gone(marker)


def test_disabled_commands_fail_non_retryably_with_a_clear_message(queue: Queue) -> None:
    job = codex_job(queue, command=["echo", "hi"])
    with pytest.raises(HandlerError) as info:
        dispatch(leased_context(queue, job, Settings.from_env({})))
    assert info.value.retryable is False
    assert "RECEIPT_CODEX_COMMANDS=enabled" in info.value.message
    assert "disabled" in info.value.message


def test_disabled_through_the_runner_fails_the_job_at_once(queue: Queue) -> None:
    job = codex_job(queue, command=["echo", "hi"])
    out = run_attempt(queue, Settings.from_env({}), default_registry(), job.id, 1)
    assert out.job is not None
    assert (out.job.status, out.job.attempt) == ("failed", 1)
    assert "RECEIPT_CODEX_COMMANDS" in out.job.error


def test_worker_secrets_are_not_visible_but_payload_env_is(
    queue: Queue, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DATABASE_URL", "postgresql://receipt:hunter2@db/receipt")
    monkeypatch.setenv("RECEIPT_CALLBACK_TOKEN", "secret-token")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
    job = codex_job(
        queue,
        command=[PY, "-c", "import json, os; print(json.dumps(dict(os.environ)))"],
        env={"TASK_FLAVOUR": "vanilla"},
    )
    env = json.loads(dispatch(leased_context(queue, job))["outputTail"])
    assert env["TASK_FLAVOUR"] == "vanilla"
    for secret in ("DATABASE_URL", "RECEIPT_CALLBACK_TOKEN", "AWS_SECRET_ACCESS_KEY"):
        assert secret not in env
    assert "hunter2" not in json.dumps(env)
    # The worker's PATH, or system folders only where the command runs as another user.
    expected = sandbox.SANDBOX_PATH if sandbox.detect_host().root else os.environ.get("PATH")
    assert env.get("PATH") == expected


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"command": "echo hi"}, "payload.command"),
        ({"command": []}, "payload.command"),
        ({"command": ["echo", 1]}, "payload.command"),
        ({}, "payload.command"),
        ({"command": ["echo"], "cwd": 5}, "payload.cwd"),
        ({"command": ["echo"], "env": {"A": 1}}, "payload.env"),
        ({"command": ["echo"], "env": ["A=1"]}, "payload.env"),
        ({"command": ["echo"], "timeout": -5}, "payload.timeout"),
        ({"command": ["echo"], "timeout": "500"}, "payload.timeout"),
        ({"command": ["echo"], "timeout": True}, "payload.timeout"),
    ],
)
def test_bad_payload_fields_fail_non_retryably_naming_the_field(
    queue: Queue, fields: dict[str, Any], named: str
) -> None:
    job = codex_job(queue, **fields)
    with pytest.raises(HandlerError) as info:
        dispatch(leased_context(queue, job))
    assert info.value.retryable is False
    assert info.value.message.startswith(named + ":")


def test_a_missing_executable_fails_non_retryably(queue: Queue) -> None:
    job = codex_job(queue, command=["/nonexistent/receipt-test-binary"])
    with pytest.raises(HandlerError) as info:
        dispatch(leased_context(queue, job))
    assert info.value.retryable is False
    assert "/nonexistent/receipt-test-binary" in info.value.message


def test_codex_runs_only_the_kinds_declared_for_it(queue: Queue) -> None:
    # (factory.task.run here; the integration kinds in tests/integration/test_integration_kinds.py)
    job = enqueue(queue, "codex", kind="factory.run", command=["echo", "hi"])
    with pytest.raises(HandlerError) as info:
        dispatch(leased_context(queue, job))
    assert info.value.retryable is False
    assert info.value.message == wrong_agent_message("codex", "factory.run")


@pytest.mark.parametrize(
    "enqueuer",
    [None, Enqueuer(token_id="tok_plain", scopes=(), system=False)],
    ids=["no-enqueuer", "no-scope"],
)
def test_a_job_without_the_commands_scope_fails_before_anything_runs(
    queue: Queue, shared_dir: Path, enqueuer: Enqueuer | None
) -> None:
    """The handler re-checks enqueuedBy, so a job written by another path stays inert."""
    job = enqueue(
        queue,
        "codex",
        kind="factory.task.run",
        max_attempts=3,
        enqueued_by=enqueuer,
        command=["touch", str(shared_dir / "ran")],
    )
    out = run_attempt(queue, ENABLED, default_registry(), job.id, 1)
    assert out.job is not None
    assert (out.job.status, out.job.attempt) == ("failed", 1)  # non-retryable: no second attempt
    assert "'commands' scope" in out.job.error
    assert not (shared_dir / "ran").exists()


def test_a_system_enqueuer_may_run_commands(queue: Queue) -> None:
    job = enqueue(queue, "codex", enqueued_by=Enqueuer("tok_sys", (), True), command=["echo", "ok"])
    assert dispatch(leased_context(queue, job))["outputTail"] == "ok\n"


def test_a_relative_executable_is_found_in_the_commands_cwd(queue: Queue, shared_dir: Path) -> None:
    repo = shared_dir / "repo"
    repo.mkdir(mode=0o777)
    tool = repo / "tool"
    tool.write_text("#!/usr/bin/python3\nprint('tool ran')\n")
    tool.chmod(0o755)
    job = codex_job(queue, command=["./tool"], cwd="repo")
    assert dispatch(leased_context(queue, job, in_workspace(shared_dir)))["outputTail"] == "tool ran\n"


def test_with_tracing_on_the_handler_span_carries_the_commands_exit_code_and_output_bytes(
    spans: Spans, queue: Queue
) -> None:
    job = codex_job(queue, command=[PY, "-c", "print('traced'); raise SystemExit(3)"])
    out = run_attempt(queue, ENABLED, default_registry(), job.id, 1)
    assert out.status == "failed" and out.job is not None
    handler = spans.one("receipt.handler")
    attributes = dict(handler.attributes or {})
    assert attributes["process.exit.code"] == 3
    assert attributes["receipt.command.output_bytes"] == len("traced\n")
    attempt = spans.one("receipt.attempt")
    assert handler.parent is not None and handler.parent.span_id == attempt.context.span_id
    assert dict(attempt.attributes or {})["receipt.outcome"] == "failed"
