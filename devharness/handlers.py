"""The fake handlers of the end-to-end tests and the soak, loaded by every worker they start.

Every worker the harness starts loads them (``RECEIPT_HANDLER_MODULES=devharness.handlers``,
``devharness.processes.base_env``).

Each agent id below is unknown to the built-in registry, so it routes to the chat group exactly
like any unrecognised agent id (spec: "Actual Resonate routing"). Every handler reports the
process and attempt that ran it, so a test can tell *which* worker process did the work.
Handlers never sleep blindly: they wait on ``ctx.wait_cancelled`` so abort, lease loss and the
execution timeout stop them at once.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from app.config import SETTINGS
from workers.handler import HandlerError, JobContext
from workers.registry import HandlerRegistry

ECHO = "e2e-echo"
SLEEP = "e2e-sleep"
GATE = "e2e-gate"
WAIT_CANCEL = "e2e-wait-cancel"
COMMANDS = "e2e-commands"
FAIL = "e2e-fail"
TASK = "e2e-task"
LEAKY = "e2e-leaky"
# The benchmarks' agent: it returns at once, so a bench measures the delivery path and nothing else.
NOOP = "noop"

POLL_S = 0.05
log = logging.getLogger("devharness.handlers")


def _who(ctx: JobContext) -> dict[str, Any]:
    return {"pid": os.getpid(), "attempt": ctx.attempt, "workerId": ctx.worker_id}


def noop(ctx: JobContext) -> Any:
    return {}


def echo(ctx: JobContext) -> Any:
    """Completes at once with its payload's ``message``."""
    return {"echo": ctx.payload.get("message"), **_who(ctx)}


def sleep(ctx: JobContext) -> Any:
    """Runs for ``seconds`` (default 1); reports one progress receipt first when ``progress`` is set."""
    if ctx.payload.get("progress"):
        ctx.progress({"started": True, "pid": os.getpid()})
    seconds = float(ctx.payload.get("seconds", 1.0))
    if ctx.wait_cancelled(seconds):
        return {"stopped": ctx.cancel_reason, **_who(ctx)}
    return {"slept": seconds, **_who(ctx)}


def gate(ctx: JobContext) -> Any:
    """Blocks until the file ``payload.gate`` exists, on the attempts listed in ``gateAttempts``.

    Attempts not listed (default: every attempt is gated) complete at once. The wait is bounded
    by the execution timeout, which cancels the context.
    """
    attempts = ctx.payload.get("gateAttempts")
    if attempts is None or ctx.attempt in attempts:
        path = Path(str(ctx.payload["gate"]))
        while not path.exists():
            if ctx.wait_cancelled(POLL_S):
                return {"stopped": ctx.cancel_reason, **_who(ctx)}
    return {"gated": True, **_who(ctx)}


def wait_cancel(ctx: JobContext) -> Any:
    """Waits for the cancellation signal; records what it saw as progress before returning."""
    if ctx.wait_cancelled(float(ctx.payload.get("seconds", 60.0))):
        ctx.progress({"sawCancel": ctx.cancel_reason, "pid": os.getpid()})
        return {"stopped": ctx.cancel_reason, **_who(ctx)}
    return {"stopped": None, **_who(ctx)}


def commands(ctx: JobContext) -> Any:
    """Reads, consumes and records queue commands until it has ``expect`` of them (or is cancelled)."""
    expect = int(ctx.payload.get("expect", 1))
    received: list[dict[str, Any]] = []
    while len(received) < expect:
        for command in ctx.commands():
            ctx.consume(command)
            received.append({"id": command.id, "type": command.type, "payload": command.payload})
        if len(received) >= expect or ctx.wait_cancelled(POLL_S):
            break
    return {"received": received, **_who(ctx)}


def fail(ctx: JobContext) -> Any:
    """Fails, retryably unless ``retryable`` is false: on every attempt, or only on those listed in
    ``failAttempts`` (the others complete)."""
    attempts = ctx.payload.get("failAttempts")
    if attempts is not None and ctx.attempt not in attempts:
        return {"recovered": True, **_who(ctx)}
    raise HandlerError(
        f"e2e failure on attempt {ctx.attempt}", retryable=bool(ctx.payload.get("retryable", True))
    )


def task(ctx: JobContext) -> Any:
    """An objective's task: optionally gated (``gate``/``gateAttempts``), slow (``seconds``) or failing
    (``fail``); completes with its task id and the ``inputs`` its dependencies passed it."""
    attempts = ctx.payload.get("gateAttempts")
    if ctx.payload.get("gate") and (attempts is None or ctx.attempt in attempts):
        path = Path(str(ctx.payload["gate"]))
        while not path.exists():
            if ctx.wait_cancelled(POLL_S):
                return {"stopped": ctx.cancel_reason, **_who(ctx)}
    if ctx.payload.get("seconds") and ctx.wait_cancelled(float(ctx.payload["seconds"])):
        return {"stopped": ctx.cancel_reason, **_who(ctx)}
    if ctx.payload.get("fail"):
        raise HandlerError(f"task {ctx.payload.get('taskId')} failed on purpose", retryable=False)
    return {"task": ctx.payload.get("taskId"), "inputs": ctx.payload.get("inputs", {}), **_who(ctx)}


def failing_task(ctx: JobContext) -> Any:
    """An objective's task that always fails, for good (the in-process Factory tests' ``test-fail``)."""
    raise HandlerError(f"task {ctx.payload.get('taskId')} failed on purpose", retryable=False)


def leaky(ctx: JobContext) -> Any:
    """Logs, then fails quoting, every secret and URL setting this worker holds: the careless
    handler that redaction exists for. ``raise`` picks the path: ``handler`` (a HandlerError) or
    ``crash`` (an unexpected exception, logged with its traceback)."""
    held = [str(v) for s in SETTINGS if (s.secret or s.url) and (v := getattr(ctx.settings, s.attr))]
    log.warning("leaky handler holds %s", held)
    text = "leaky: " + " ".join(held)
    if ctx.payload.get("raise") == "crash":
        raise RuntimeError(text)
    raise HandlerError(text, retryable=False)


def register(registry: HandlerRegistry) -> None:
    registry.register(ECHO, echo)
    registry.register(SLEEP, sleep)
    registry.register(GATE, gate)
    registry.register(WAIT_CANCEL, wait_cancel)
    registry.register(COMMANDS, commands)
    registry.register(FAIL, fail)
    registry.register(TASK, task)
    registry.register(LEAKY, leaky)
    registry.register(NOOP, noop)
