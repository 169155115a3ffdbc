"""The ``codex`` handler: runs a ``factory.task.run`` command as a subprocess.

- The command is an argv list of strings, never run through a shell.
- It runs in its own process group; on abort, lease loss, the payload ``timeout`` or the
  execution timeout (whichever comes first) the whole group is killed.
- Its environment is a small fixed base plus the payload's ``env``: the worker's own variables
  (database URLs, tokens) are never handed to a command.
- Output is reported as ``job.progress`` in batches; the result carries ``exitCode`` and an
  output tail. A non-zero exit is a retryable failure carrying both.
- Off unless the deployment sets ``RECEIPT_CODEX_COMMANDS=enabled``.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from typing import Any

from workers.handler import HandlerError, JobContext
from workers.handlers import integration

BASE_ENV_NAMES = ("PATH", "HOME", "LANG", "LC_ALL", "TZ", "TMPDIR")
PROGRESS_EVERY_S = 0.5
POLL_S = 0.05
KILL_GRACE_S = 2.0


def _bad(field: str, message: str) -> HandlerError:
    return HandlerError(f"payload.{field}: {message}", retryable=False)


def parse_command(payload: Mapping[str, Any]) -> tuple[list[str], str | None, dict[str, str], int | None]:
    """Validate the command fields of a ``factory.task.run`` payload."""
    command = payload.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(a, str) for a in command):
        raise _bad(
            "command", "must be a non-empty list of strings (an argv; it is never run through a shell)"
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


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    except ProcessLookupError:
        pass


def handle(ctx: JobContext) -> Any:
    if ctx.job.kind in integration.KINDS and not integration.runs_command(ctx.job.kind, ctx.payload):
        return integration.publish(ctx)  # a signed POST, not a command
    if ctx.job.kind not in ("factory.task.run", *integration.KINDS):
        raise HandlerError(
            f"agent 'codex' cannot run kind '{ctx.job.kind}' yet: the Factory layer is not installed",
            retryable=False,
        )
    if not ctx.settings.codex_commands_enabled:
        raise HandlerError(
            "codex commands are disabled on this deployment (set RECEIPT_CODEX_COMMANDS=enabled)",
            retryable=False,
        )
    argv, cwd, env, timeout_ms = parse_command(ctx.payload)
    child_env = {k: os.environ[k] for k in BASE_ENV_NAMES if k in os.environ}
    child_env.update(env)
    try:
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=child_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    except (OSError, ValueError) as exc:
        raise HandlerError(f"cannot start {argv[0]!r}: {exc}", retryable=False) from exc

    output = _Output(ctx.settings.codex_output_tail_bytes)

    def pump() -> None:
        stdout = proc.stdout
        assert isinstance(stdout, io.BufferedReader)  # Popen(stdout=PIPE), unbuffered=False: read1 exists
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
    if stop_reason is not None:
        _kill_group(proc)
    reader.join(timeout=KILL_GRACE_S)
    _report(ctx, output)
    exit_code = proc.returncode
    result = {"exitCode": exit_code, "outputTail": output.tail(), "outputBytes": output.total}
    if stop_reason == "timeout":
        raise HandlerError(
            f"command timed out after {timeout_ms} ms; process group killed",
            retryable=True,
            status="execution_timeout",
            result=result,
        )
    if stop_reason is not None:
        # The runner decides how a cancellation settles; this only records what was killed.
        return result
    if exit_code != 0:
        raise HandlerError(
            f"command exited with {exit_code}: {output.tail()[-500:]}", retryable=True, result=result
        )
    return result


def _report(ctx: JobContext, output: _Output) -> None:
    chunk = output.take_pending()
    if chunk:
        ctx.progress({"output": chunk.decode("utf-8", "replace"), "outputBytes": output.total})
