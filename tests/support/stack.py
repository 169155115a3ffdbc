"""Re-exported from ``devharness.stack``, the harness's home (``bench/`` imports it there).

``make_stack`` here skips the test (fails it in CI) when redis-server is missing.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from app.jobs.routing import EXECUTE_BATCH_TASK, EXECUTE_TASK
from devharness import stack as _stack
from devharness.processes import Harness
from devharness.services import ServiceUnavailable
from devharness.stack import (
    BOOT_TIMEOUT_S,
    FAST_TIMINGS,
    ORG,
    ROLE_PROCESS,
    SYSTEM_ORG,
    TERMINAL_TYPES,
    Stack,
    key_of,
    terminal_receipts,
    terminate_backends,
    worker_pid,
)
from tests.support.databases import unavailable

__all__ = [
    "BOOT_TIMEOUT_S",
    "FAST_TIMINGS",
    "ORG",
    "ROLE_PROCESS",
    "SYSTEM_ORG",
    "TERMINAL_TYPES",
    "Stack",
    "key_of",
    "make_stack",
    "terminal_receipts",
    "terminate_backends",
    "waiting_fences",
    "worker_pid",
]


# Connections each process of a test stack keeps open between uses. Each of the two xdist workers
# can have a module's stack and a dedicated one up at once, six processes each: at the default
# (10) those four idle stacks alone hold ~85 connections, and the suite ran out of PostgreSQL's
# default max_connections (100). Under load a process still opens what it needs.
TEST_POOL_SIZE = "2"
# gunicorn's keep-alive for a test's web (production's is 5 s): its graceful stop at teardown
# waits for the last connection's keep-alive to run out, which cost every test about 4 s.
TEST_KEEP_ALIVE_S = 1


def make_stack(harness: Harness, database_url: str, home: Path, **env_overrides: str) -> Stack:
    """``devharness.stack.make_stack``, skipping the test when redis-server is not installed; its
    processes keep ``TEST_POOL_SIZE`` connections open between uses, its web ``TEST_KEEP_ALIVE_S``."""
    env_overrides.setdefault("RECEIPT_DB_POOL_SIZE", TEST_POOL_SIZE)
    try:
        stack = _stack.make_stack(harness, database_url, home, **env_overrides)
    except ServiceUnavailable as exc:
        unavailable("redis-server", exc)
    stack.web_keep_alive_s = TEST_KEEP_ALIVE_S
    return stack


def waiting_fences(broker: Any, queue: str) -> list[str]:
    """The fence of every attempt whose worker message waits in ``queue`` of the Redis ``broker``:
    one per ``receipt.execute`` message, one per item of a ``receipt.execute_batch`` (a scan sends
    the attempts bound for one queue together)."""
    fences: list[str] = []
    for raw in broker.lrange(queue, 0, -1):
        message = json.loads(raw)
        args, _kwargs, _embed = json.loads(base64.b64decode(message["body"]))
        if message["headers"]["task"] == EXECUTE_BATCH_TASK:
            fences.extend(str(item[1]) for item in args[0])
        elif message["headers"]["task"] == EXECUTE_TASK:
            fences.append(str(args[1]))
    return fences
