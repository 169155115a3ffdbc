"""Deliveries lost with the process that fetched their message (delivery/fetches.py), on the real
database and Redis: the redrive settles them ``fetcher_lost`` and starts the next generation in the
same pass; a delivery a live consumer holds is never superseded, not even by the presumption."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from sqlalchemy import update
from sqlalchemy.engine import Engine

from app.jobs.routing import DRIVER_TASK, EXECUTE_TASK, route
from app.ops import loop_registry
from app.storage.db import db_now, deliveries, transaction
from app.storage.delivery import driver_task_id
from delivery import dispatch, fetches
from delivery.broker import RedisProbe
from tests.support.clock import ManualClock
from workers import loop_passes

from .runtime_support import enqueue, recording_runtime, settings_for


@pytest.fixture
def runtime(engine: Engine, redis_url: str) -> Iterator[Any]:
    settings = settings_for(
        redis_url,
        RECEIPT_RESONATE_QUEUED_REDRIVE_INTERVAL_MS="0",
        RECEIPT_RESONATE_QUEUED_REDRIVE_MIN_AGE_MS="0",
        RECEIPT_RESONATE_QUEUED_REDRIVE_COOLDOWN_MS="0",
    )
    rt, sent, _ = recording_runtime(engine, settings)
    rt.broker = RedisProbe(redis_url)
    client = redis.Redis.from_url(redis_url)
    try:
        yield rt, sent, client
    finally:
        client.close()


def _redrive(rt: Any) -> dict[str, Any]:
    """One queued-redrive pass. The interval is 0, so its claim lives only ``MIN_CLAIM_TTL_MS``;
    its clock stands still, so a pass slowed past that by a loaded machine keeps its claim and
    these tests see the pass's result, not the claim rules (test_loop_registry.py has those)."""
    return loop_passes.run(rt, loop_registry.QUEUED_REDRIVE, clock=ManualClock())


def _first_delivery(rt: Any, sent: Any) -> tuple[str, str]:
    job = enqueue(rt.queue, "factory")
    sent.clear()
    assert _redrive(rt)["redriven"] == [job.id]
    [message] = sent.named(EXECUTE_TASK)
    sent.clear()
    # A consumer records a worker message under its delivery's id (delivery/fetches.py).
    return job.id, driver_task_id(message.args[2], message.args[3])


def _states(rt: Any, job_id: str) -> list[tuple[int, str, str | None]]:
    with rt.engine.connect() as conn:
        rows = conn.execute(
            deliveries.select().where(deliveries.c.job_id == job_id).order_by(deliveries.c.generation)
        ).all()
    return [(r.generation, r.state, r.outcome) for r in rows]


def _age(rt: Any, job_id: str, seconds: int) -> None:
    """Backdate the job's deliveries, so the presumption (>= 5 s old, queues empty) would apply."""
    with transaction(rt.engine) as conn:
        conn.execute(
            update(deliveries)
            .where(deliveries.c.job_id == job_id)
            .values(created_at=db_now(conn) - timedelta(seconds=seconds))
        )


@pytest.mark.parametrize("stage", ["driver", "worker"])
def test_a_delivery_fetched_by_a_dead_consumer_is_settled_and_redriven_in_the_same_pass(
    runtime: Any, stage: str
) -> None:
    rt, sent, client = runtime
    job_id, task_id = _first_delivery(rt, sent)
    client.set(fetches.FETCH_PREFIX + task_id, f"{stage} host:1:dead")  # no liveness key: gone
    result = _redrive(rt)
    assert result["fetcherLost"] == [job_id] and result["redriven"] == [job_id]
    [message] = sent.named(EXECUTE_TASK)
    assert message.args[3] == 1  # the next generation of the same key, within the 32 bound
    assert _states(rt, job_id) == [(0, "settled", "fetcher_lost"), (1, "pending", None)]


def test_a_delivery_held_by_a_live_consumer_is_not_superseded_even_with_every_queue_empty(
    runtime: Any,
) -> None:
    rt, sent, client = runtime
    job_id, task_id = _first_delivery(rt, sent)
    _age(rt, job_id, 60)
    client.set(fetches.FETCH_PREFIX + task_id, "worker host:2:live")
    client.set(fetches.LIVE_PREFIX + "host:2:live", b"1", px=fetches.LIVENESS_TTL_MS)
    assert rt.broker.queues_empty(["receipt-driver", "receipt-chat"]) is True
    result = _redrive(rt)
    assert result["redriven"] == [] and result["fetcherLost"] == []
    assert sent.sent == [] and _states(rt, job_id) == [(0, "pending", None)]
    client.delete(fetches.LIVE_PREFIX + "host:2:live")  # ... until that consumer's key lapses
    assert _redrive(rt)["fetcherLost"] == [job_id]
    assert _states(rt, job_id) == [(0, "settled", "fetcher_lost"), (1, "pending", None)]


def test_a_message_recorded_as_sent_is_left_to_the_earlier_rules(runtime: Any) -> None:
    rt, sent, client = runtime
    job_id, task_id = _first_delivery(rt, sent)
    client.set(fetches.FETCH_PREFIX + task_id, "sent host:3:dead")  # its sender died after sending
    assert _redrive(rt)["redriven"] == []
    assert _states(rt, job_id) == [(0, "pending", None)]
    _age(rt, job_id, 60)  # the presumption still applies once it is old and every queue is empty
    assert _redrive(rt)["redriven"] == [job_id]
    assert _states(rt, job_id) == [(0, "settled", "presumed_lost"), (1, "pending", None)]


def test_a_task_that_raised_gave_up_its_delivery_though_its_consumer_lives(runtime: Any) -> None:
    rt, sent, client = runtime
    job_id, task_id = _first_delivery(rt, sent)
    client.set(fetches.FETCH_PREFIX + task_id, "failed")
    assert _redrive(rt)["fetcherLost"] == [job_id]


def test_the_recorder_keeps_its_liveness_and_writes_one_pipeline_per_message(redis_url: str) -> None:
    settings = settings_for(redis_url)
    recorder = fetches.Recorder(settings)
    client = redis.Redis.from_url(redis_url)
    try:
        recorder.start()
        live = fetches.LIVE_PREFIX + recorder.consumer
        assert 0 < client.pttl(live) <= fetches.LIVENESS_TTL_MS
        recorder.write(fetches.fetched_entries(DRIVER_TASK, ["j", "j", 0], recorder.consumer))
        key = fetches.FETCH_PREFIX + "j:driver:0"
        assert client.get(key) == f"driver {recorder.consumer}".encode()
        assert fetches.LIVENESS_TTL_MS < client.pttl(key) <= fetches.record_ttl_ms(settings)
    finally:
        recorder.stop()
        client.close()
    dead = fetches.Recorder(settings_for("redis://127.0.0.1:1/0"))
    dead.write([("k", "v")])  # an unreachable broker: logged, never raised


def test_a_pass_records_its_claims_and_their_messages_sent_in_one_write(
    pg_engine: Engine, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim has committed before either record: the scan records (``dispatching:<job>``) and
    the messages' ``sent`` records go in one pipeline, before any message leaves."""
    rt, sent, _ = recording_runtime(pg_engine, settings_for(redis_url))
    recorder = fetches.Recorder(settings_for(redis_url))
    writes: list[list[tuple[str, str]]] = []
    real = recorder.write

    # An empty write sends nothing (``Recorder.write``): only the ones that reach Redis count.
    def counted(entries: Any) -> None:
        if entries:
            writes.append(list(entries))
        real(entries)

    monkeypatch.setattr(recorder, "write", counted)
    monkeypatch.setattr(fetches, "_recorder", recorder)
    client = redis.Redis.from_url(redis_url)
    try:
        job = enqueue(rt.queue, "factory")
        writes.clear()
        assert dispatch.dispatch_queue(rt, route("factory", "factory.task.run").queue) == [job.id]
        [message] = sent.named(EXECUTE_TASK)
        fetch_key = fetches.FETCH_PREFIX + driver_task_id(message.args[2], message.args[3])
        assert writes == [
            [
                (fetches.DISPATCHING_PREFIX + job.id, recorder.consumer),
                (fetch_key, f"sent {recorder.consumer}"),
            ]
        ]
        assert client.get(fetch_key) == f"sent {recorder.consumer}".encode()
        assert client.get(fetches.DISPATCHING_PREFIX + job.id) == recorder.consumer.encode()
    finally:
        client.close()
