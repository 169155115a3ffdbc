"""The ``codex`` command runner: runs a job's command in the sandbox (``workers.sandbox``).

It is the handler of ``factory.task.run`` and runs the command of the integration kinds
(``workers.handlers.integration``); ``app.jobs.privilege.runs_command`` says which jobs run one.

- Only for a job whose recorded enqueuer holds the ``commands`` scope or is a system token;
  anything else fails non-retryably before a process starts.
- The command is an argv list of strings, never run through a shell.
- It runs sandboxed (a user id of its own, its own PID, IPC and network namespaces, a private
  filesystem view holding no other command's files and no host socket, rlimits, a scratch
  directory per attempt); on abort, lease loss, the payload ``timeout`` or the execution timeout
  (whichever comes first) it gets SIGTERM then SIGKILL, and at the end of *every* attempt
  whatever is left of its process tree is killed.
- Its environment is a small fixed base plus the payload's ``env``: the worker's own variables
  (database URLs, tokens) are never handed to a command, and the sandbox keeps it from reading
  them out of ``/proc`` either.
- Output is reported as ``job.progress`` in batches; the result carries ``exitCode`` and an
  output tail. A non-zero exit is a retryable failure carrying both.
- Off unless the deployment sets ``RECEIPT_CODEX_COMMANDS=enabled``.
"""

from __future__ import annotations

import io
import os
import shutil
import signal
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from app import tracing
from app.jobs import kinds
from app.jobs.contracts import COMMAND_FIELD
from app.jobs.liveness import FENCED
from app.jobs.privilege import COMMANDS_SCOPE, runs_command
from workers import liveness, sandbox
from workers.handler import HandlerError, JobContext
from workers.kinds import handles
from workers.sandbox_users import NoFreeUid, UnusableLockDir

BASE_ENV_NAMES = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR")
PROGRESS_EVERY_S = 0.5
POLL_S = 0.05
KILL_GRACE_S = 2.0


def _bad(field: str, message: str) -> HandlerError:
    return HandlerError(f"payload.{field}: {message}", retryable=False)


def parse_command(payload: Mapping[str, Any]) -> tuple[list[str], str | None, dict[str, str], int | None]:
    """Validate the command fields of a payload that runs a command."""
    command = payload.get(COMMAND_FIELD)
    if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
        raise _bad(
            COMMAND_FIELD, "must be a non-empty list of strings (an argv; it is never run through a shell)"
        )
    cwd = payload.get("cwd")
    if cwd is not None and not isinstance(cwd, str):
        raise _bad("cwd", "must be a string")
    env = payload.get("env") or {}
    if not isinstance(env, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in env.items()
    ):
        raise _bad("env", "must be an object of string values")
    timeout = payload.get("timeout")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, int) or timeout <= 0):
        raise _bad("timeout", "must be a positive integer of milliseconds")
    return list(command), cwd, dict(env), timeout


class _Output:
    """Collects a process's output: a bounded tail plus the chunk not yet reported."""

    def __init__(self, tail_bytes: int) -> None:
        self._tail_bytes = tail_bytes
        self._tail = b""
        self._pending = b""
        self.total = 0
        self._lock = threading.Lock()

    def feed(self, data: bytes) -> None:
        with self._lock:
            self.total += len(data)
            self._tail = (self._tail + data)[-self._tail_bytes :]
            self._pending = (self._pending + data)[-self._tail_bytes :]

    def take_pending(self) -> bytes:
        with self._lock:
            out, self._pending = self._pending, b""
            return out

    def tail(self) -> str:
        with self._lock:
            return self._tail.decode("utf-8", "replace")


def _refuse_unprivileged(ctx: JobContext) -> None:
    """Re-check, before anything runs, that whoever enqueued the job may run commands.

    The API refuses such posts without the scope; this catches a job written by any other path.
    """
    enqueuer = ctx.job.enqueued_by
    if enqueuer is None or not enqueuer.may_run_commands:
        who = "no recorded enqueuer" if enqueuer is None else f"token {enqueuer.token_id!r}"
        raise HandlerError(
            f"refusing to run the command of job {ctx.job.id}: it was enqueued by {who} without the "
            f"{COMMANDS_SCOPE!r} scope (or a system token)",
            retryable=False,
        )


def _check_executable(
    argv0: str,
    env: Mapping[str, str],
    workdir: Path,
    config: sandbox.SandboxConfig,
    host: sandbox.Host,
    attempt: sandbox.Attempt,
) -> None:
    # Inside the sandbox an exec failure is only an exit status; say it plainly before starting.
    if "/" in argv0:
        path: Path | None = workdir / argv0  # an absolute argv0 replaces workdir
    else:
        which = shutil.which(argv0, path=env.get("PATH"))
        path = Path(which) if which else None
    if path is None or not path.is_file():
        raise HandlerError(f"cannot start {argv0!r}: no such executable", retryable=False)
    if not sandbox.visible(path, config, host, attempt):
        raise HandlerError(
            f"cannot start {argv0!r}: {path} is outside the command's filesystem view "
            "(RECEIPT_CODEX_VISIBLE_PATHS, the workspace root, the scratch directory)",
            retryable=False,
        )


@handles(kinds.TASK_RUN)
def run_command(ctx: JobContext) -> Any:
    """Run the job's command; refused non-retryably for a job that, by its kind, runs none."""
    if not runs_command(ctx.job.agent_id, ctx.job.kind, ctx.payload):
        raise HandlerError(
            f"a {ctx.job.kind} job for agent {ctx.job.agent_id!r} runs no command", retryable=False
        )
    if not ctx.settings.codex_commands:
        raise HandlerError(
            "codex commands are disabled on this deployment (set RECEIPT_CODEX_COMMANDS=enabled)",
            retryable=False,
        )
    _refuse_unprivileged(ctx)
    argv, cwd, env, timeout_ms = parse_command(ctx.payload)
    try:
        config = sandbox.SandboxConfig.from_settings(ctx.settings)
    except ValueError as exc:
        raise HandlerError(str(exc), retryable=False) from exc
    host = sandbox.detect_host()
    try:
        with sandbox.attempt(config, host) as attempt:
            scratch = attempt.scratch
            workdir = sandbox.resolve_cwd(cwd, scratch, config.workspace_root)
            child_env = {k: os.environ[k] for k in BASE_ENV_NAMES if k in os.environ}
            if host.root:
                # The worker's PATH may list folders only root can use (a pyenv under /root).
                child_env["PATH"] = sandbox.SANDBOX_PATH
            # The scratch directory is the command's home and temp: nothing of the worker's.
            child_env.update({"HOME": str(scratch), "TMPDIR": str(scratch)})
            child_env.update(env)
            _check_executable(argv[0], child_env, workdir, config, host, attempt)
            return _run(ctx, argv, workdir, child_env, timeout_ms, config, host, attempt)
    except sandbox.SandboxRefused as exc:
        raise HandlerError(str(exc), retryable=False) from exc
    except (NoFreeUid, UnusableLockDir) as exc:
        # Busy ids clear as attempts end; an unsafe claims folder needs the operator, and until
        # then no attempt can start safely, so each one fails and waits for its retry.
        raise HandlerError(str(exc), retryable=True) from exc


def _run(
    ctx: JobContext,
    argv: list[str],
    workdir: Path,
    env: dict[str, str],
    timeout_ms: int | None,
    config: sandbox.SandboxConfig,
    host: sandbox.Host,
    attempt: sandbox.Attempt,
) -> Any:
    try:
        proc = sandbox.start(argv, env=env, cwd=workdir, config=config, host=host, attempt=attempt)
    except (OSError, ValueError) as exc:
        raise HandlerError(f"cannot start {argv[0]!r}: {exc}", retryable=False) from exc

    withdraw = liveness.on_fence(ctx, proc.kill)  # a fenced worker kills it even if this thread is stuck
    output = _Output(ctx.settings.codex_output_tail_bytes)
    stdout = proc.popen.stdout
    assert isinstance(stdout, io.BufferedReader)  # Popen(stdout=PIPE), unbuffered=False: read1 exists

    def pump() -> None:
        # The reader owns the pipe and closes it at EOF: a worker runs many commands, and each
        # unclosed pipe would leak a file descriptor (closing it from another thread mid-read
        # would block on the reader's buffer lock instead).
        with stdout:
            for chunk in iter(lambda: stdout.read1(65536), b""):
                output.feed(chunk)

    reader = threading.Thread(target=pump, name=f"codex-output-{proc.pid}", daemon=True)
    reader.start()
    started = time.monotonic()
    last_report = started
    stop_reason: str | None = None
    try:
        while proc.poll() is None:
            if ctx.wait_cancelled(POLL_S):
                stop_reason = ctx.cancel_reason or "canceled"
                break
            if timeout_ms is not None and (time.monotonic() - started) * 1000 >= timeout_ms:
                stop_reason = "timeout"
                break
            if time.monotonic() - last_report >= PROGRESS_EVERY_S:
                _report(ctx, output)
                last_report = time.monotonic()
        if stop_reason == FENCED:
            proc.kill()  # at once: another worker may start this job once the fence's margin is spent
        elif stop_reason is not None:
            proc.terminate(KILL_GRACE_S)
    finally:
        # Every attempt ends with the whole tree gone, however it ended.
        withdraw()
        proc.finish()
    reader.join(timeout=KILL_GRACE_S)
    _report(ctx, output)
    exit_code = proc.popen.returncode
    result = {"exitCode": exit_code, "outputTail": output.tail(), "outputBytes": output.total}
    tracing.note_command(exit_code, output.total)
    if stop_reason == "timeout":
        raise HandlerError(
            f"command timed out after {timeout_ms} ms; every process it started was killed",
            retryable=True,
            status="execution_timeout",
            result=result,
        )
    if stop_reason is not None:
        # The runner decides how a cancellation settles; this only records what was killed.
        return result
    if exit_code != 0:
        raise HandlerError(
            f"command exited with {exit_code}: {output.tail()[-500:]}",
            retryable=True,
            result=result,
            interrupted=killed_by_stop_signal(exit_code),
        )
    return result


# The signals a platform stops a process with (and an operator's Ctrl-C, a closed terminal).
STOP_SIGNALS = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL})


def killed_by_stop_signal(exit_code: int | None) -> bool:
    """Whether a command's exit status says a stop signal ended it: ``-N`` when the sandbox's first
    process died of it, ``128 + N`` when a shell or the sandbox passed its child's death on."""
    if exit_code is None:
        return False
    number = -exit_code if exit_code < 0 else exit_code - 128
    return number in STOP_SIGNALS


def _report(ctx: JobContext, output: _Output) -> None:
    chunk = output.take_pending()
    if chunk:
        ctx.progress({"output": chunk.decode("utf-8", "replace"), "outputBytes": output.total})
