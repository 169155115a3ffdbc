"""The rule that decides a pending delivery lost with the process that fetched its message."""

from __future__ import annotations

import logging
from typing import Any

import pytest

from app.config import Settings
from app.jobs.routing import DISPATCH_TASK, DRIVER_TASK, EXECUTE_BATCH_TASK, EXECUTE_TASK
from app.ops import outages
from app.ops.outages import Watch
from app.ops.preflight import BROKER, Problem
from app.storage.delivery import driver_task_id
from delivery import fetches
from delivery.fetches import (
    DISPATCHING_PREFIX,
    FAILED,
    FETCH_PREFIX,
    HELD_ALIVE,
    INLINE_MIN_AGE_MS,
    LOST,
    UNKNOWN,
    Pending,
    Record,
    failed_entries,
    fetched_entries,
    lost,
    published_entries,
    scan_entries,
    verdict,
)
from tests.support.fake_redis import URL, FakeRedis

BASE = Pending("j1", "dispatch", "", 0, "j1:driver:0", age_ms=INLINE_MIN_AGE_MS)
REDRIVE = Pending("j1", "redrive", "1:queued", 0, "j1:redrive:1:queued:driver:0", age_ms=10_000)


def test_a_held_message_is_lost_only_when_its_fetcher_is_gone() -> None:
    for stage in ("driver", "worker"):
        assert lost(REDRIVE, Record(stage, "c1"), None, alive=set())
        assert not lost(REDRIVE, Record(stage, "c1"), None, alive={"c1"})


def test_a_message_recorded_as_sent_may_still_wait_in_the_broker_whoever_died() -> None:
    # The driver that sent the worker message died; the message waits for a worker: not lost.
    assert not lost(BASE, Record("sent", "c1"), "c1", alive=set())
    assert not lost(REDRIVE, Record("queued", None), None, alive=set())


def test_a_task_that_raised_gave_up_on_its_message_though_its_consumer_lives() -> None:
    assert lost(REDRIVE, Record("failed", None), None, alive={"c1"})
    assert lost(BASE, None, "failed", alive={"c1"})
    assert failed_entries(DRIVER_TASK, ["j1", "j1:redrive:1:queued", 0]) == [
        (FETCH_PREFIX + REDRIVE.task_id, "failed")
    ]
    assert failed_entries(DISPATCH_TASK, [["j1"]]) == [(DISPATCHING_PREFIX + "j1", "failed")]


def test_a_message_held_by_a_live_consumer_is_held_not_unknown() -> None:
    assert verdict(REDRIVE, Record("worker", "c1"), None, alive={"c1"}) == HELD_ALIVE
    assert verdict(REDRIVE, Record("sent", "c1"), None, alive={"c1"}) == UNKNOWN
    assert verdict(REDRIVE, None, None, alive=set()) == UNKNOWN
    assert verdict(REDRIVE, Record("worker", "c1"), None, alive=set()) == LOST


def test_no_record_is_unknown_except_for_a_scan_whose_consumer_died() -> None:
    assert not lost(REDRIVE, None, None, alive=set())
    assert not lost(REDRIVE, None, "c1", alive=set())  # only base-key deliveries are scan-created
    assert lost(BASE, None, "c1", alive=set())
    assert not lost(BASE, None, "c1", alive={"c1"})
    young = Pending("j1", "dispatch", "", 0, "j1:driver:0", age_ms=INLINE_MIN_AGE_MS - 1)
    assert not lost(young, None, "c1", alive=set())  # a live driver may be between record and send


def test_what_each_message_records() -> None:
    key = "j1:redrive:3:queued"
    assert fetched_entries(DRIVER_TASK, ["j1", key, 2], "c1") == [
        (FETCH_PREFIX + driver_task_id(key, 2), "driver c1")
    ]
    assert fetched_entries(EXECUTE_TASK, ["j1", "j1:attempt:1", key, 2], "c2") == [
        (FETCH_PREFIX + driver_task_id(key, 2), "worker c2")
    ]
    assert fetched_entries(DISPATCH_TASK, [["a", "b"]], "c3") == [
        (DISPATCHING_PREFIX + "a", "c3"),
        (DISPATCHING_PREFIX + "b", "c3"),
    ]
    assert fetched_entries("receipt.loops.redrive", [], "c1") == []
    assert fetched_entries(EXECUTE_TASK, ["malformed"], "c1") == []
    assert published_entries(DRIVER_TASK, driver_task_id(key, 2), ["j1", key, 2], "c1") == [
        (FETCH_PREFIX + driver_task_id(key, 2), "queued")
    ]
    assert published_entries(EXECUTE_TASK, "j1:attempt:1", ["j1", "j1:attempt:1", key, 2], "c1") == [
        (FETCH_PREFIX + driver_task_id(key, 2), "sent c1")
    ]
    assert published_entries(DISPATCH_TASK, "x", [["j1"]], "c1") == []


def test_a_scan_batch_from_the_wake_list_is_recorded_like_a_message_that_named_its_jobs() -> None:
    # The coalesced wake-up names no jobs (delivery/wakes.py): the scan records its batch itself.
    assert fetched_entries(DISPATCH_TASK, [[]], "c3") == []
    assert scan_entries(["a", "b"], "c3") == fetched_entries(DISPATCH_TASK, [["a", "b"]], "c3")
    assert scan_entries(["a"], "failed") == [(DISPATCHING_PREFIX + "a", "failed")]


def test_a_scan_batch_records_its_worker_messages_sent_in_one_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """One write for the batch, before any publish; the per-publish hook adds none."""

    class Stub:
        consumer = "c1"

        def __init__(self) -> None:
            self.writes: list[list[tuple[str, str]]] = []

        def write(self, entries: list[tuple[str, str]]) -> None:
            if entries:
                self.writes.append(list(entries))

    stub = Stub()
    monkeypatch.setattr(fetches, "_recorder", stub)
    batch = [("a", "a", 0), ("b", "b", 1)]
    with fetches.sent_in_advance(batch) as advance:
        advance.write()
        assert stub.writes == [
            [
                (FETCH_PREFIX + driver_task_id("a", 0), "sent c1"),
                (FETCH_PREFIX + driver_task_id("b", 1), "sent c1"),
            ]
        ]
        for job, key, generation in batch:
            message: tuple[object, ...] = ([job, f"{job}:attempt:1", key, generation], {}, {})
            fetches.on_before_task_publish(
                sender=EXECUTE_TASK, body=message, headers={"id": f"{job}:attempt:1"}
            )
    assert len(stub.writes) == 1
    # Outside a batch the hook still records each publish.
    fetches.on_before_task_publish(
        sender=EXECUTE_TASK, body=(["c", "c:attempt:1", "c", 0], {}, {}), headers={}
    )
    assert stub.writes[-1] == [(FETCH_PREFIX + driver_task_id("c", 0), "sent c1")]


# -- the records in Redis (in memory here; tests/integration/test_fetches.py uses the real server) ----


def test_the_recorder_keeps_its_liveness_and_writes_each_record_with_its_ttl(fake_redis: FakeRedis) -> None:
    settings = Settings.from_env({"REDIS_URL": URL})
    recorder = fetches.Recorder(settings)
    client = fake_redis.client()
    recorder.start()
    try:
        live = fetches.LIVE_PREFIX + recorder.consumer
        assert 0 < client.pttl(live) <= fetches.LIVENESS_TTL_MS
        recorder.write(fetched_entries(DRIVER_TASK, ["j", "j", 0], recorder.consumer))
        key = FETCH_PREFIX + "j:driver:0"
        assert client.get(key) == f"driver {recorder.consumer}".encode()
        assert fetches.LIVENESS_TTL_MS < client.pttl(key) <= fetches.record_ttl_ms(settings)
    finally:
        recorder.stop()


def test_verdicts_read_the_records_and_the_liveness_they_name(fake_redis: FakeRedis) -> None:
    client = fake_redis.client()
    held = Pending("held", "dispatch", "", 0, "held:driver:0", age_ms=10_000)
    gone = Pending("gone", "dispatch", "", 0, "gone:driver:0", age_ms=10_000)
    sent = Pending("sent", "dispatch", "", 0, "sent:driver:0", age_ms=10_000)
    scanned = Pending("scanned", "dispatch", "", 0, "scanned:driver:0", age_ms=INLINE_MIN_AGE_MS)
    client.set(FETCH_PREFIX + held.task_id, "worker host:1:live")
    client.set(fetches.LIVE_PREFIX + "host:1:live", b"1")
    client.set(FETCH_PREFIX + gone.task_id, "driver host:2:dead")
    client.set(FETCH_PREFIX + sent.task_id, "sent host:2:dead")
    client.set(DISPATCHING_PREFIX + scanned.job_id, "host:2:dead")
    assert fetches.verdicts(client, [held, gone, sent, scanned]) == [HELD_ALIVE, LOST, UNKNOWN, LOST]
    assert fetches.verdicts(client, []) == []


def test_a_broker_that_is_down_costs_the_records_and_one_warning_never_an_error(
    fake_redis: FakeRedis, caplog: pytest.LogCaptureFixture
) -> None:
    recorder = fetches.Recorder(Settings.from_env({"REDIS_URL": URL}))
    fake_redis.down()
    for _ in range(3):
        recorder.write([("k", "v")])
        recorder.refresh()
    warnings = [r for r in caplog.records if r.name == "receipt.fetches" and r.levelname == "WARNING"]
    assert len(warnings) == 1
    fake_redis.up()
    recorder.write([("k", "v")])
    assert fake_redis.client().get("k") == b"v"


def test_each_failed_write_tells_the_watch_and_each_run_of_failures_warns_once(
    fake_redis: FakeRedis, caplog: pytest.LogCaptureFixture
) -> None:
    # The liveness thread writes every second whatever the consumer is doing: its failures are how a
    # process whose consumer polls nothing (every slot busy) still says the broker is lost.
    lost = Problem(BROKER, "REDIS_URL=redis://fake", "no Redis answers", "start it")
    asked: list[int] = []

    def probe() -> Problem | None:
        asked.append(1)
        return None if fake_redis.server.connected else lost

    watch = outages.use(Watch({BROKER: probe}, retry_s=60))
    try:
        recorder = fetches.Recorder(Settings.from_env({"REDIS_URL": URL}))
        caplog.set_level(logging.DEBUG, logger="receipt.fetches")
        fake_redis.down()
        recorder.refresh()
        assert watch.down(BROKER) is not None and len(asked) == 1
        fake_redis.up()
        recorder.refresh()
        fake_redis.down()
        recorder.write([("k", "v")])
        warnings = [r for r in caplog.records if r.name == "receipt.fetches" and r.levelname == "WARNING"]
        assert len(warnings) == 2  # one per run of failures, not one per process lifetime
    finally:
        outages.uninstall()


def test_a_batch_message_records_each_of_its_deliveries_under_its_own_key() -> None:
    items: list[list[Any]] = [["a", "a:attempt:1", "a", 0], ["b", "b:attempt:3", "b:redrive:4:queued", 2]]
    keys = [FETCH_PREFIX + driver_task_id("a", 0), FETCH_PREFIX + driver_task_id("b:redrive:4:queued", 2)]
    assert fetched_entries(EXECUTE_BATCH_TASK, [items], "c9") == [(k, "worker c9") for k in keys]
    assert failed_entries(EXECUTE_BATCH_TASK, [items]) == [(k, FAILED) for k in keys]
    assert published_entries(EXECUTE_BATCH_TASK, "a:attempt:1:batch:2", [items], "c1") == [
        (k, "sent c1") for k in keys
    ]
    # Each item is judged on its own record: the batch's consumer gone makes every one lost.
    for (_key, value), (job, _fence, dispatch_key, generation) in zip(
        fetched_entries(EXECUTE_BATCH_TASK, [items], "c9"), items, strict=True
    ):
        pending = Pending(job, "dispatch", "", generation, driver_task_id(dispatch_key, generation), 0)
        assert verdict(pending, Record.parse(value), None, alive={"c1"}) == LOST
        assert verdict(pending, Record.parse(value), None, alive={"c9"}) == HELD_ALIVE
    assert fetched_entries(EXECUTE_BATCH_TASK, [[["only", "three", "fields"]]], "c1") == []


def test_a_scan_batch_records_what_it_runs_itself_as_fetched_in_the_same_one_write(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Attempts the pass keeps for this process's slots (no message) are recorded as its fetch, in
    the batch's one write with the scan's records and the sent ones; a block that ends without its
    ``write`` writes then, once."""

    class Stub:
        consumer = "c1"

        def __init__(self) -> None:
            self.writes: list[list[tuple[str, str]]] = []

        def write(self, entries: list[tuple[str, str]]) -> None:
            self.writes.append(list(entries))

    stub = Stub()
    monkeypatch.setattr(fetches, "_recorder", stub)
    batch = [("a", "a", 0), ("b", "b", 1)]
    with fetches.sent_in_advance(batch, scanned=["a", "b"]) as advance:
        advance.hold([["b", "b:attempt:1", "b", 1]])
    assert stub.writes == [
        [
            (fetches.DISPATCHING_PREFIX + "a", "c1"),
            (fetches.DISPATCHING_PREFIX + "b", "c1"),
            (FETCH_PREFIX + driver_task_id("a", 0), "sent c1"),
            (FETCH_PREFIX + driver_task_id("b", 1), f"{fetches.WORKER} c1"),
        ]
    ]
    with pytest.raises(RuntimeError), fetches.sent_in_advance(batch):
        raise RuntimeError("the pipeline failed: nothing left, nothing more to record")
    assert len(stub.writes) == 1
