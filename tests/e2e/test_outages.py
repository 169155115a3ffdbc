"""A broker lost while everything runs: each process says so in one log line, ``/readyz`` names it,
and each says one more line when it answers again — whatever its retry loops do meanwhile
(app/ops/outages.py). The database's side is in test_faults.py (PostgreSQL cut twice)."""

from __future__ import annotations

import contextlib
import os
import signal
import time

import pytest

from tests.support.stack import Stack
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e")]

# How long the broker stays down once every process has noticed: long enough for each retry loop
# to fail several times over (Celery's reconnect at 1, 2 and 4 s, the liveness key every second,
# the wake listener's backoff, beat's publishes every 250 ms to 5 s).
OUTAGE_S = 8.0


def test_a_lost_broker_is_one_line_per_process_and_one_more_when_it_answers(stack: Stack) -> None:
    stack.start("web", "driver", "chat", "beat")
    server = stack.redis_server
    assert server is not None
    refused = f"no Redis answers at 127.0.0.1:{server.port} (connection refused)"
    # The cause is the first failure a process met: a new connection refused, or a read in flight
    # when the server died (reset by peer). Either way one line says the broker is lost.
    lost = f"REDIS_URL={stack.redis_url}: lost — "
    back = f"REDIS_URL={stack.redis_url}: answers again after "
    workers = ("driver", "chat", "beat")

    server.kill()
    for name in workers:
        _wait_or_dump_threads(stack, name, lost, "to say the broker is lost")
    readyz = stack.http.get(stack.url("/readyz"), headers=stack.headers(system=True), timeout=15)
    assert readyz.status_code == 503
    broker = readyz.json()["error"]["details"]["broker"]
    assert broker.startswith(f"unreachable: REDIS_URL: {refused} (down since "), broker
    time.sleep(OUTAGE_S)  # the outage itself, not synchronisation: every retry loop fails meanwhile

    server.start()
    for name in (*workers, "web"):
        _wait_or_dump_threads(stack, name, back, "to say the broker answers")
    ready = stack.http.get(stack.url("/readyz"), headers=stack.headers(system=True), timeout=15)
    assert ready.status_code == 200, ready.text
    assert ready.json()["broker"] == "ok"

    for name in (*workers, "web"):
        proc = stack.procs[name]
        assert (proc.log_count(lost), proc.log_count(back)) == (1, 1), proc.tail(80)
        # No retry said it again: redis-py's own words ("Error 111 ... Connection refused.") are
        # in no line, nor Celery's reconnect or beat's failed publishes.
        assert proc.log_count("Connection refused") == 0, proc.tail(80)
        assert proc.log_count("Trying to re-establish") == 0
        assert proc.log_count("Couldn't apply scheduled task") == 0
    assert stack.procs["driver"].lines_with(lost)[0].split()[2:5] == ["ERROR", "driver", "receipt.outage:"]


def _wait_or_dump_threads(stack: Stack, name: str, line: str, what: str) -> None:
    """Wait for ``name`` to log ``line``; if it never does, fail with every thread's stack (Celery
    prints them on SIGUSR1; beat and gunicorn do not, their log says what they did) and the log's
    lines other than the recovery loops' chatter, so a silent process can be told from a slow one."""
    proc = stack.procs[name]
    try:
        wait_for(lambda: proc.log_count(line), 30, what=f"{name} {what}")
    except AssertionError as exc:
        if name in ("driver", "chat") and proc.alive():
            os.kill(proc.pid, signal.SIGUSR1)
            with contextlib.suppress(AssertionError):
                wait_for(lambda: proc.log_count("LOCAL VARIABLES"), 10, what="the thread dump")
        kept = "\n".join(x for x in proc.log().splitlines() if "receipt.loops:" not in x)
        raise AssertionError(f"{exc}\n----- {name}, without its loop lines -----\n{kept}") from exc
