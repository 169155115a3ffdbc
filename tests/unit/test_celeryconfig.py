"""Celery settings chosen for "Postgres receipts decide, Celery delivers".

Each assertion pins one decision recorded in ``celeryconfig.py`` and docs/design.md.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from celery import Celery

import celeryconfig
from app.config import Settings
from app.jobs.routing import (
    DISPATCH_TASK,
    DRIVER_QUEUE,
    DRIVER_TASK,
    EXECUTE_BATCH_TASK,
    EXECUTE_TASK,
    MAINTENANCE_QUEUE,
    OBJECTIVES_QUEUE,
    QUEUES,
)
from app.ops import loop_registry, outages, preflight
from tasks.beat import ReceiptBeat, prepare
from tasks.celery_app import make_celery
from tasks.cron import CronSchedule

REDRIVE_TASK = loop_registry.QUEUED_REDRIVE.task
EXPIRE_TASK = loop_registry.LEASE_EXPIRY.task
RETRY_TASK = loop_registry.DUE_RETRIES.task
OUTBOX_TASK = loop_registry.OUTBOX_REDRIVE.task
WATCHDOG_TASK = loop_registry.OBJECTIVE_WATCHDOG.task

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
    assert {e["task"] for e in schedule.values()} == {
        REDRIVE_TASK,
        EXPIRE_TASK,
        RETRY_TASK,
        loop_registry.SCHEDULES.task,
        loop_registry.WORKER_LIVENESS.task,
        loop_registry.LOST_DELIVERIES.task,
    }
    by_task = {e["task"]: e for e in schedule.values()}
    assert by_task[loop_registry.LOST_DELIVERIES.task]["schedule"].total_seconds() == 1.0
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
        EXECUTE_BATCH_TASK,
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
    # The plain-data configuration (no Celery there) leaves it out; the Celery app adds it.
    assert "objective-watchdog" not in build(tmp_path)["beat_schedule"]
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


def test_the_embedded_broker_uses_the_atomic_folder_transport(tmp_path: Path) -> None:
    conf = build(tmp_path)
    assert conf["broker_transport"] == "delivery.folder_transport:Transport"
    options = conf["broker_transport_options"]
    assert options["dead_letter_folder"] == str(tmp_path / "broker" / "dead")
    assert options["claim_folder"] == str(tmp_path / "broker" / "claimed")


# -- the module Celery reads by name --------------------------------------------------------------


@pytest.fixture
def from_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Settings]:
    """The environment ``celeryconfig`` reads, with its once-per-process cache cleared around the test."""
    monkeypatch.setenv("RECEIPT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("REDIS_URL", REDIS)
    monkeypatch.setenv("RECEIPT_RESONATE_QUEUED_REDRIVE_INTERVAL_MS", "7000")
    celeryconfig.settings.cache_clear()
    celeryconfig.configuration.cache_clear()
    try:
        yield Settings.from_env()
    finally:
        celeryconfig.settings.cache_clear()
        celeryconfig.configuration.cache_clear()


def test_config_from_object_by_name_reads_the_mapping_built_from_the_environment(
    from_env: Settings,
) -> None:
    app = Celery("reader", set_as_current=False)
    app.config_from_object("celeryconfig")
    built = celeryconfig.build(from_env)
    assert {k: app.conf[k] for k in built} == built
    assert app.conf.broker_url == REDIS
    assert app.conf.beat_schedule["queued-redrive"]["schedule"].total_seconds() == 7.0
    # Only the settings become keys of the app's configuration, never the module's helpers.
    assert {"build", "broker_url_for", "QUEUES", "settings"}.isdisjoint(app.conf.keys())


def test_make_celery_without_settings_reads_celeryconfig_by_name(from_env: Settings) -> None:
    app = make_celery()
    assert app._config_source == "celeryconfig"  # what `celery -A tasks.celery_app …` builds
    assert app.conf.broker_url == REDIS and app.receipt_settings == from_env
    assert EXECUTE_TASK in app.tasks


def test_module_attributes_are_the_settings_and_helpers_keep_their_own_names(from_env: Settings) -> None:
    assert celeryconfig.broker_url == REDIS
    assert celeryconfig.task_default_queue == DRIVER_QUEUE
    assert sorted(dir(celeryconfig)) == sorted(celeryconfig.build(from_env))
    with pytest.raises(AttributeError, match="no_such_setting"):
        _ = celeryconfig.no_such_setting


# -- the Celery configuration names no worker module a publisher loads ------------------------------

# Settings Celery resolves only inside a worker (its consumer bootstep): the web process never
# loads what they name.
WORKER_ONLY = {"worker_consumer"}
REFERENCE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


def references(conf: dict[str, Any]) -> dict[str, str]:
    """Every ``module:attribute`` string of the configuration, by setting."""
    return {k: v for k, v in conf.items() if isinstance(v, str) and REFERENCE.match(v)}


def test_the_references_a_publisher_loads_name_no_worker_module(conf: dict[str, Any]) -> None:
    for key, ref in references(conf).items():
        module = ref.split(":", 1)[0]
        if key in WORKER_ONLY:
            continue
        assert module.split(".")[0] not in {"tasks", "workers"}, f"{key}={ref} drags worker code in"
        # and it resolves, without any worker package being imported along the way
        attribute = getattr(importlib.import_module(module), ref.split(":", 1)[1])
        assert attribute is not None


def test_the_worker_only_references_are_the_ones_known(tmp_path: Path) -> None:
    refs = references(build(tmp_path, REDIS_URL=REDIS))
    assert refs == {
        "broker_transport": "delivery.redis_transport:Transport",
        "worker_consumer": "tasks.consumer:BackoffConsumer",
    }


# -- beat: the plain command runs Receipt's start-up ------------------------------------------------


def test_the_apps_beat_is_receipts(tmp_path: Path) -> None:
    app = make_celery(Settings(home=str(tmp_path)))
    assert issubclass(app.Beat, ReceiptBeat) and app.Beat.app is app
    assert app.Beat().quiet is False  # the plain log format keeps Celery's banner
    assert app.Beat(quiet=True).quiet is True
    json_app = make_celery(Settings(home=str(tmp_path), log_format="json"))
    assert json_app.Beat().quiet is True  # the banner would be the only non-JSON lines


def test_beat_prepare_refuses_an_invalid_cron_checks_its_services_and_makes_the_home_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[dict[str, Any]] = []
    # The start-up check itself is tests/integration/test_preflight.py's: here, that beat asks for it.
    monkeypatch.setattr(preflight, "require", lambda settings, **kw: checked.append(kw))
    monkeypatch.setattr(outages, "install", lambda settings: None)
    home = tmp_path / "home"
    with pytest.raises(SystemExit, match="RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_CRON"):
        prepare(Settings(home=str(home), objective_watchdog_cron="*/5 * * *"))
    assert checked == []  # an invalid schedule is refused before anything is opened
    prepare(Settings(home=str(home)))
    assert [(c["database"], c["broker"]) for c in checked] == [(preflight.Schema.HEAD, True)]
    assert home.is_dir() and home.stat().st_mode & 0o777 == 0o700
