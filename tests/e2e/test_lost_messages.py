"""A worker message lost before any process fetched it is sent again in seconds, and a process
started while the broker is down waits for it: real processes, one test per fault (docs/faults.md,
"Lost messages").

The queued redrive runs at its production defaults here (every 15 s, for jobs queued 30 s), so a
job that ends within 15 s of its fault was recovered by the ``lost-deliveries`` loop
(``RECEIPT_REDELIVER_UNFETCHED_MS``, 2 s here, 5 s by default) and nothing else. Each job must end with
**no extra attempt charged**: attempt 1, one lease, one terminal receipt.
"""

from __future__ import annotations

import base64
import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from app.config import Settings
from app.jobs.routing import QUEUES
from devharness import handlers
from devharness.credits import offer_slots, withdraw
from tasks.celery_app import make_celery
from tests.support.processes import PYTHON
from tests.support.stack import Stack, terminal_receipts
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e")]

CHAT = QUEUES["chat"]
# The recovery bound: the job ends at most this long after its fault clears.
RECOVERY_S = 15.0
# The queued redrive as deployed, so it cannot be what recovers a job within RECOVERY_S.
PRODUCTION_REDRIVE = {
    "RECEIPT_RESONATE_QUEUED_REDRIVE_INTERVAL_MS": "15000",
    "RECEIPT_RESONATE_QUEUED_REDRIVE_MIN_AGE_MS": "30000",
    "RECEIPT_RESONATE_QUEUED_REDRIVE_COOLDOWN_MS": "15000",
    "RECEIPT_RESONATE_QUEUED_REDRIVE_STARTUP_DELAY_MS": "5000",
}


# A message nobody fetched is judged lost 2 s after it was sent (production: 5 s), so each test
# waits less for the recovery it checks; the redrive above still cannot be what recovers the job.
UNFETCHED_AFTER = {"RECEIPT_REDELIVER_UNFETCHED_MS": "2000"}


def _production_redrive(stack: Stack) -> None:
    stack.timings.update(PRODUCTION_REDRIVE)
    stack.timings.update(UNFETCHED_AFTER)


def _ended_once_at_attempt_1(stack: Stack, job_id: str) -> None:
    job = stack.job(job_id)
    assert job is not None and job.status == "completed", job
    assert job.attempt == 1
    types = stack.types(job_id)
    assert types.count("job.leased") == 1, types
    assert len(terminal_receipts(stack.receipts(job_id))) == 1, types


def _outcomes(stack: Stack, job_id: str) -> list[str | None]:
    return [d.outcome for d in stack.deliveries(job_id)]


def _ended_within(stack: Stack, job_id: str, cleared: float, what: str) -> float:
    stack.wait_terminal(job_id, timeout=RECOVERY_S - (time.monotonic() - cleared))
    took = time.monotonic() - cleared
    print(f"{what}: the job ended {took:.1f} s after the fault cleared")
    return took


def _consumers(stack: Stack, action: str) -> None:
    """Stop (``cancel``) or resume (``add``) the chat workers' consuming of ``receipt-chat`` with
    Celery's own remote control: a SIGSTOPped worker would still take messages (CELERY-NOTES)."""
    app = make_celery(Settings.from_env(stack.env()))
    try:
        call = app.control.cancel_consumer if action == "cancel" else app.control.add_consumer
        replies = call(CHAT, reply=True, timeout=5, limit=1)
        assert replies, f"no worker answered {action}_consumer"
    finally:
        app.close()


# -- Redis -------------------------------------------------------------------------------------------


def _dead_letters(stack: Stack) -> list[dict[str, Any]]:
    """The rows ``receipt dead-letters`` lists on this deployment."""
    listed = subprocess.run(
        [PYTHON, "-m", "app.ops.cli", "dead-letters"],
        env=stack.env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    rows: list[dict[str, Any]] = json.loads(listed.stdout)["rows"]
    return rows


def test_a_redis_queue_key_deleted_between_send_and_fetch(stack: Stack) -> None:
    _production_redrive(stack)
    stack.start("web", "driver", "chat", "beat")
    _consumers(stack, "cancel")
    job_id = stack.post_job(handlers.ECHO)["id"]
    broker = redis.Redis.from_url(stack.redis_url)
    wait_for(lambda: broker.llen(CHAT) >= 1, 15, what="the worker message waiting in receipt-chat")
    assert broker.delete(CHAT) == 1
    cleared = time.monotonic()  # counted from the loss itself, consumers still stopped
    _consumers(stack, "add")
    _ended_within(stack, job_id, cleared, "queue key deleted")
    _ended_once_at_attempt_1(stack, job_id)
    assert "unfetched" in _outcomes(stack, job_id)
    assert stack.procs["chat"].alive()


def test_garbage_on_a_redis_queue_becomes_dead_letters_and_the_worker_goes_on(stack: Stack) -> None:
    """Bytes that are not JSON and an object with no kombu envelope (the transport's check), and an
    envelope whose body Celery cannot parse (Celery's ``on_decode_error``): each is logged once and
    listed by ``receipt dead-letters``; the chat worker never stops and runs the next job."""
    stack.start("web", "driver", "chat", "beat")
    broker = redis.Redis.from_url(stack.redis_url)
    unparsable_body = {
        "body": base64.b64encode(b"not json").decode(),
        "content-encoding": "utf-8",
        "content-type": "application/json",
        "headers": {},
        "properties": {
            "delivery_tag": "t-1",
            "body_encoding": "base64",
            "delivery_info": {"exchange": CHAT, "routing_key": CHAT},
            "priority": 0,
        },
    }
    for raw in (b"\x00garbage", b'{"body": "x"}', json.dumps(unparsable_body).encode()):
        broker.lpush(CHAT, raw)
    wait_for(lambda: broker.llen("receipt:dead-letters") == 3, 30, what="three dead letters")
    chat = stack.procs["chat"]
    job_id = stack.post_job(handlers.ECHO)["id"]
    assert stack.wait_terminal(job_id, timeout=RECOVERY_S).status == "completed"
    assert chat.alive()
    assert chat.log_count("Unrecoverable error") == 0
    assert chat.log_count(f"undecodable message on queue {CHAT}") == 3
    rows = _dead_letters(stack)
    # The transport keeps the raw bytes; Celery's consumer keeps the body it could not parse.
    assert sorted(r["size"] for r in rows) == [len(b"not json"), len(b"\x00garbage"), len(b'{"body": "x"}')]
    assert {r["queue"] for r in rows} == {CHAT}


def test_redis_restarted_from_an_older_snapshot(stack: Stack, tmp_path: Path) -> None:
    """A snapshot is taken, then a job's worker message is written; Redis dies and comes back from
    that snapshot: the broker epoch survived (it was in the snapshot), the message did not."""
    server = stack.redis_server
    assert server is not None
    data = tmp_path / "redis-data"
    data.mkdir()
    server.kill()
    server.start(data_dir=data)
    _production_redrive(stack)
    stack.start("web", "driver", "chat", "beat")
    _consumers(stack, "cancel")
    broker = redis.Redis.from_url(stack.redis_url)
    wait_for(lambda: broker.get("receipt:broker-epoch") is not None, 15, what="the broker epoch")
    broker.save()
    job_id = stack.post_job(handlers.ECHO)["id"]
    wait_for(lambda: broker.llen(CHAT) >= 1, 15, what="the worker message waiting in receipt-chat")
    server.kill()
    server.start(data_dir=data)
    cleared = time.monotonic()
    broker = redis.Redis.from_url(stack.redis_url)  # the old client's connection died with the server
    assert broker.get("receipt:broker-epoch") is not None  # restored: no epoch change to go by
    assert broker.llen(CHAT) == 0  # the message was written after the snapshot
    # The chat worker reconnected with its consumer still cancelled: resume it.
    wait_for(lambda: _try_add(stack), 15, what="the chat worker answering add_consumer again")
    _ended_within(stack, job_id, cleared, "restarted from an older snapshot")
    _ended_once_at_attempt_1(stack, job_id)
    assert "unfetched" in _outcomes(stack, job_id)
    for name in ("driver", "chat", "beat"):
        assert stack.procs[name].alive(), name


def _try_add(stack: Stack) -> bool:
    try:
        _consumers(stack, "add")
    except (AssertionError, redis.RedisError, OSError):  # not reconnected yet
        return False
    return True


def test_a_worker_started_during_a_redis_outage_waits_then_runs(stack: Stack) -> None:
    stack.timings.update(UNFETCHED_AFTER)
    stack.start("web", "driver", "beat")
    server = stack.redis_server
    assert server is not None
    job_id = stack.post_job(handlers.ECHO)["id"]
    server.kill()
    chat = stack.start_worker("worker-chat", "chat", wait=False)
    wait_for(
        lambda: chat.log_count("waiting for REDIS_URL (try 2") == 1, 30, what="two tries of the chat worker"
    )
    assert chat.alive()
    server.start()  # back on the same port, empty
    cleared = time.monotonic()
    stack.wait_worker(chat)
    _ended_within(stack, job_id, cleared, "worker started during the outage")
    _ended_once_at_attempt_1(stack, job_id)
    assert chat.alive() and chat.log_count("start-up checks pass after") == 1
    assert chat.log_count("waiting for REDIS_URL (try 1,") == 1  # one line a try


# -- the embedded folder broker ---------------------------------------------------------------------


@pytest.mark.parametrize(("fault", "content"), [("emptied", b""), ("corrupted", b'{"body": "eyJ')])
def test_a_message_file_emptied_or_corrupted_in_the_embedded_broker(
    stack: Stack, fault: str, content: bytes
) -> None:
    """The embedded folder broker (no REDIS_URL) under PostgreSQL: the chat worker's message file is
    overwritten before any chat worker runs; the worker that then starts keeps it as a dead letter,
    logs it once, goes on consuming, and the job is sent again and completes."""
    _production_redrive(stack)
    stack.env_overrides["REDIS_URL"] = ""
    stack.start("web", "driver", "beat")
    # A slot offered for the chat worker to come (the dispatch pass sends only to offered slots):
    # its message file is written before any chat process runs.
    offer = offer_slots(stack.engine, slots=1, queues=[CHAT])
    job_id = stack.post_job(handlers.ECHO)["id"]
    data = stack.home / "broker" / "data"
    found = wait_for(
        lambda: [p for p in data.iterdir() if p.name.endswith(f".{CHAT}.msg")], 15, what="the message file"
    )
    [message] = found
    message.write_bytes(content)
    chat = stack.start_worker("worker-chat", "chat")
    withdraw(stack.engine, offer)  # from here on, the real worker's own offer
    cleared = time.monotonic()
    _ended_within(stack, job_id, cleared, f"message file {fault}")
    _ended_once_at_attempt_1(stack, job_id)
    assert "unfetched" in _outcomes(stack, job_id)
    assert chat.alive()
    assert chat.log_count("Unrecoverable error") == 0
    assert chat.log_count(f"undecodable message on queue {CHAT}") == 1
    rows = _dead_letters(stack)
    assert [(r["queue"], r["size"]) for r in rows] == [(CHAT, len(content))]
    # The worker goes on consuming: a second job runs on it.
    second = stack.post_job(handlers.ECHO)["id"]
    assert stack.wait_terminal(second, timeout=RECOVERY_S).status == "completed"
