"""Celery settings chosen for "Postgres receipts decide, Celery delivers" (issue 4, item 6).

Each assertion pins one decision recorded in ``celeryconfig.py`` and docs/design.md.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import celeryconfig
from app.config import Settings
from app.jobs.routing import DRIVER_QUEUE, MAINTENANCE_QUEUE, OBJECTIVES_QUEUE, QUEUES
from tasks.celery_app import make_celery
from tasks.cron import CronSchedule
from tasks.runtime import (
    DISPATCH_TASK,
    DRIVER_TASK,
    EXECUTE_TASK,
    EXPIRE_TASK,
    OUTBOX_TASK,
    REDRIVE_TASK,
    RETRY_TASK,
    WATCHDOG_TASK,
)

REDIS = "redis://127.0.0.1:6379/9"
EVERY_QUEUE = {DRIVER_QUEUE, MAINTENANCE_QUEUE, OBJECTIVES_QUEUE, *QUEUES.values()}


def build(tmp_path: Path, **env: str) -> dict[str, Any]:
    return celeryconfig.build(Settings.from_env({"RECEIPT_HOME": str(tmp_path), **env}))


@pytest.fixture(params=["redis", "embedded"])
def conf(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    return build(tmp_path, **({"REDIS_URL": REDIS} if request.param == "redis" else {}))


def test_early_ack_so_a_broker_blip_cannot_rerun_a_long_job(conf: dict[str, Any]) -> None:
    assert conf["task_acks_late"] is False


def test_prefetch_one_message_per_slot(conf: dict[str, Any]) -> None:
    assert conf["worker_prefetch_multiplier"] == 1


def test_a_killed_pool_child_is_not_rerun(conf: dict[str, Any]) -> None:
    assert conf["task_reject_on_worker_lost"] is False


def test_running_work_survives_a_broker_connection_loss(conf: dict[str, Any]) -> None:
    assert conf["worker_cancel_long_running_tasks_on_connection_loss"] is False


def test_broker_reconnect_forever_including_at_startup_with_the_backoff_consumer(
    conf: dict[str, Any],
) -> None:
    assert conf["broker_connection_retry_on_startup"] is True
    assert conf["broker_connection_max_retries"] is None
    assert conf["worker_consumer"] == "tasks.consumer:BackoffConsumer"


def test_no_result_backend_is_relied_on(conf: dict[str, Any]) -> None:
    assert conf["result_backend"] is None
    assert conf["task_ignore_result"] is True


def test_each_queue_has_its_own_direct_exchange_and_routing_key(tmp_path: Path) -> None:
    # Read back through Celery, which turns the configuration's mapping into kombu queues.
    app = make_celery(Settings.from_env({"RECEIPT_HOME": str(tmp_path), "REDIS_URL": REDIS}))
    queues = list(app.amqp.queues.values())
    assert {q.name for q in queues} == EVERY_QUEUE
    assert len(queues) == len(EVERY_QUEUE)
    for q in queues:
        assert q.exchange.name == q.name
        assert q.exchange.type == "direct"
        assert q.routing_key == q.name
    assert len({q.exchange.name for q in queues}) == len(queues)


def test_unknown_queues_are_a_deployment_error(conf: dict[str, Any]) -> None:
    assert conf["task_create_missing_queues"] is False
    assert conf["task_default_queue"] == DRIVER_QUEUE


def test_redis_keeps_no_copy_of_fetched_messages(tmp_path: Path) -> None:
    # kombu's ack emulation is off: no unacked copy in Redis, so no visibility timeout that could
    # redeliver a running one-hour codex job, and none to configure (tests/integration/
    # test_redis_transport.py consumes through it).
    conf = build(tmp_path, REDIS_URL=REDIS)
    assert conf["broker_url"] == REDIS
    assert conf["broker_transport_options"] == {"ack_emulation": False}


def test_disable_prefetch_only_with_redis(tmp_path: Path) -> None:
    assert build(tmp_path, REDIS_URL=REDIS)["worker_disable_prefetch"] is True
    assert "worker_disable_prefetch" not in build(tmp_path)


def test_embedded_broker_sets_every_folder_under_receipt_home(tmp_path: Path) -> None:
    conf = build(tmp_path)
    assert conf["broker_url"] == "filesystem://localhost/"  # a host: no kombu "No hostname" warning
    options = conf["broker_transport_options"]
    root = tmp_path.resolve()
    for key in ("data_folder_in", "data_folder_out", "control_folder", "processed_folder"):
        folder = Path(options[key])
        assert folder.is_relative_to(root), key
        assert folder.is_dir(), key
    # In and out must be the same folder, or producers and consumers never meet.
    assert options["data_folder_in"] == options["data_folder_out"]
    assert options["polling_interval"] <= 0.1
    assert "visibility_timeout" not in options and "ack_emulation" not in options
    assert Path(conf["beat_schedule_filename"]).is_relative_to(root)


def test_beat_schedules_every_loop_on_the_maintenance_queue(tmp_path: Path) -> None:
    conf = build(
        tmp_path,
        RECEIPT_RESONATE_QUEUED_REDRIVE_INTERVAL_MS="7000",
        RECEIPT_LEASE_EXPIRY_INTERVAL_MS="3000",
        RECEIPT_RETRY_SCAN_INTERVAL_MS="500",
        RECEIPT_OBJECTIVE_CONTROL_OUTBOX_REDRIVE_INTERVAL_MS="2500",
    )
    schedule = dict(conf["beat_schedule"])
    # The objective-control outbox redrive has its own queue: only worker-control and all consume it.
    outbox = schedule.pop("objective-outbox-redrive")
    assert outbox["task"] == OUTBOX_TASK and outbox["options"]["queue"] == OBJECTIVES_QUEUE
    assert outbox["schedule"].total_seconds() == 2.5
    assert {e["task"] for e in schedule.values()} == {REDRIVE_TASK, EXPIRE_TASK, RETRY_TASK}
    by_task = {e["task"]: e for e in schedule.values()}
    assert by_task[REDRIVE_TASK]["schedule"].total_seconds() == 7.0
    assert by_task[EXPIRE_TASK]["schedule"].total_seconds() == 3.0
    assert by_task[RETRY_TASK]["schedule"].total_seconds() == 0.5
    for entry in schedule.values():
        assert entry["options"]["queue"] == MAINTENANCE_QUEUE


def test_make_celery_applies_the_configuration_and_registers_every_task(tmp_path: Path) -> None:
    app = make_celery(Settings.from_env({"RECEIPT_HOME": str(tmp_path), "REDIS_URL": REDIS}))
    assert app.conf.task_acks_late is False
    assert app.conf.worker_prefetch_multiplier == 1
    assert app.conf.worker_consumer == "tasks.consumer:BackoffConsumer"
    assert app.conf.broker_transport_options["ack_emulation"] is False
    for name in (
        DISPATCH_TASK,
        DRIVER_TASK,
        EXECUTE_TASK,
        REDRIVE_TASK,
        EXPIRE_TASK,
        RETRY_TASK,
        OUTBOX_TASK,
    ):
        assert name in app.tasks


def test_two_apps_in_one_process_each_register_their_own_tasks(tmp_path: Path) -> None:
    """The API's waker and a worker may both build an app: no shared-task collision (a warning = error)."""
    settings = Settings.from_env({"RECEIPT_HOME": str(tmp_path), "REDIS_URL": REDIS})
    first, second = make_celery(settings), make_celery(settings)
    for app in (first, second):
        task = app.tasks[EXECUTE_TASK]
        assert task.app is app


def test_the_watchdog_crontab_tick_is_added_to_beat_on_the_objectives_queue(tmp_path: Path) -> None:
    # Plain data in celeryconfig.py (no Celery there); the Celery app makes it a schedule.
    beat = make_celery(Settings(home=str(tmp_path))).conf.beat_schedule
    tick = beat["objective-watchdog"]
    assert tick["task"] == WATCHDOG_TASK and tick["options"]["queue"] == OBJECTIVES_QUEUE
    assert tick["schedule"] == CronSchedule("* * * * *")
    off = make_celery(Settings(home=str(tmp_path), objective_watchdog_enabled=False)).conf.beat_schedule
    assert "objective-watchdog" not in off


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://127.0.0.1:6379/9", "delivery.redis_transport:Transport"),
        ("rediss://cache.example:6380/0", "delivery.redis_transport:Transport"),
        ("sentinel://127.0.0.1:26379", None),
    ],
)
def test_plain_redis_urls_use_the_transport_that_reuses_its_client(
    tmp_path: Path, url: str, expected: str | None
) -> None:
    assert build(tmp_path, REDIS_URL=url)["broker_transport"] == expected


def test_the_embedded_broker_keeps_its_own_transport(tmp_path: Path) -> None:
    assert build(tmp_path)["broker_transport"] is None
