"""The recovery-loop registry (``app/ops/loop_registry.py``): everything that runs a loop is derived from it.

Beat's schedule, the Celery tasks, each role's local ticker, ``/readyz``, the loop metrics and the
docs table are each compared with ``LOOPS`` under several deployments; one test adds a loop by one
declaration plus its pass and finds it everywhere. The spec's defaults are pinned here too, with an
injected clock instead of waiting (``celery.schedules.schedule``'s ``nowfun``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
from celery.schedules import schedule as celery_schedule
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import Engine

from api.health import check_loops
from app.config import Settings
from app.cron import next_after
from app.factory import recovery
from app.jobs.routing import MAINTENANCE_QUEUE, OBJECTIVES_QUEUE
from app.ops import loop_registry, metrics
from app.ops.loop_registry import Every, Loop
from tasks import celery_app
from tasks.celery_app import make_celery
from tasks.cron import CronSchedule
from workers import loop_passes
from workers.roles import ROLES
from workers.runtime import Runtime

REDIS = "redis://127.0.0.1:6379/9"
T0 = datetime(2026, 1, 1, 12, 0, 0, 500_000, tzinfo=UTC)


def settings(tmp_path: Path, **env: str) -> Settings:
    return Settings.from_env({"RECEIPT_HOME": str(tmp_path), "REDIS_URL": REDIS, **env})


DEPLOYMENTS = {
    "default": {},
    "callbacks": {"RECEIPT_RESONATE_CALLBACK_URL": "http://hooks.invalid/x"},
    "watchdog-off": {"RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_ENABLED": "0"},
}


@pytest.fixture(params=sorted(DEPLOYMENTS))
def deployment(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    return settings(tmp_path, **DEPLOYMENTS[request.param])


def names(loops: Any) -> set[str]:
    return {loop.name for loop in loops}


def test_which_loops_a_deployment_runs() -> None:
    every = names(loop_registry.LOOPS)
    assert every == {
        "queued-redrive",
        "lease-expiry",
        "due-retries",
        "callbacks",
        "objective-outbox-redrive",
        "objective-watchdog",
        "schedules",
        "worker-liveness",
        "lost-deliveries",
        "archive",
    }
    assert names(loop_registry.active(Settings())) == every - {"callbacks", "archive"}
    assert names(loop_registry.active(Settings(callback_url="http://h.invalid/", retention_days=30))) == every
    assert names(loop_registry.active(Settings(objective_watchdog_enabled=False))) == every - {
        "callbacks",
        "objective-watchdog",
        "archive",
    }
    # One organisation's window is enough to run the pass; a 0 override alone is not.
    assert "archive" in names(loop_registry.active(Settings(retention_days_by_organization=(("acme", 5),))))
    assert "archive" not in names(
        loop_registry.active(Settings(retention_days_by_organization=(("acme", 0),)))
    )


# -- the spec's defaults, exactly ---------------------------------------------------------------------


def test_the_spec_defaults_of_the_four_loops() -> None:
    s = Settings()
    redrive, outbox, watchdog = (
        loop_registry.QUEUED_REDRIVE,
        loop_registry.OUTBOX_REDRIVE,
        loop_registry.OBJECTIVE_WATCHDOG,
    )
    # Queued-job redrive: 15 000 ms, its first pass after a 5 000 ms startup delay.
    assert redrive.schedule.period_ms(s, T0) == 15_000
    assert redrive.schedule.first_delay_ms(s) == 5_000
    assert loop_registry.first_passes(s) == [(redrive, 5_000)]
    # Objective-control outbox redrive: every 5 000 ms, single-flight, held while slow, and its
    # 15 000 ms timeout only observes (logs factory.control_outbox_redrive_slow).
    policy = loop_registry.policy(outbox, s, T0)
    assert outbox.schedule.period_ms(s, T0) == 5_000
    assert (policy.holds, policy.slow_after_ms, policy.slow_event) == (
        True,
        15_000,
        "factory.control_outbox_redrive_slow",
    )
    assert outbox.queue == OBJECTIVES_QUEUE
    # Objective watchdog: cron `* * * * *` (a tick a minute), on the objectives queue.
    assert isinstance(watchdog.schedule, loop_registry.Cron)
    assert watchdog.schedule.checked(s) == "* * * * *"
    assert watchdog.schedule.period_ms(s, T0) == 60_000
    assert watchdog.queue == OBJECTIVES_QUEUE
    # The maintenance loops keep their claim only while they make progress.
    for loop in (redrive, loop_registry.LEASE_EXPIRY, loop_registry.DUE_RETRIES, loop_registry.CALLBACKS):
        assert loop.queue == MAINTENANCE_QUEUE and loop_registry.policy(loop, s, T0).holds is False


def test_beat_fires_the_outbox_redrive_every_5000_ms_by_an_injected_clock(tmp_path: Path) -> None:
    app = make_celery(settings(tmp_path))
    entry = app.conf.beat_schedule["objective-outbox-redrive"]
    now = [T0]
    sched = celery_schedule(entry["schedule"], nowfun=lambda: now[0], app=app)
    last = T0
    for after_ms, due in ((0, False), (4_999, False), (5_000, True), (7_000, True)):
        now[0] = T0 + timedelta(milliseconds=after_ms)
        state = sched.is_due(last)
        assert state.is_due is due, after_ms
        if due:
            assert state.next == 5.0  # and again 5 s after this one
    # A tick nobody consumed within one period is dropped, not piled up.
    assert entry["options"] == {"queue": OBJECTIVES_QUEUE, "expires": 5.0}


def test_beat_sends_the_first_queued_redrive_5000_ms_after_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = make_celery(settings(tmp_path))
    sent: list[tuple[str, dict[str, Any]]] = []
    app.send_task = lambda name, **options: sent.append((name, options))
    resumed: list[str] = []
    monkeypatch.setattr(recovery, "schedule_resume", lambda _q, _s, role: resumed.append(role))
    app.receipt_runtime = SimpleNamespace(queue=None)
    celery_app._first_passes_after_startup_delay(sender=SimpleNamespace(app=app))
    assert sent == [(loop_registry.QUEUED_REDRIVE.task, {"queue": MAINTENANCE_QUEUE, "countdown": 5.0})]
    assert resumed == ["beat"]


def test_beat_refuses_to_start_on_a_schedule_that_cannot_run(tmp_path: Path) -> None:
    app = make_celery(settings(tmp_path, RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_CRON="every minute"))
    assert "objective-watchdog" not in app.conf.beat_schedule
    with pytest.raises(SystemExit, match="RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_CRON"):
        celery_app._first_passes_after_startup_delay(sender=SimpleNamespace(app=app))


# -- everything derives from the registry ---------------------------------------------------------------


def expected_schedule(loop: Loop, s: Settings) -> Any:
    if isinstance(loop.schedule, Every):
        period = loop.schedule.period_ms(s, T0)
        if loop.schedule.on_the_second and period % 1000 == 0 and 60 % (period // 1000) == 0:
            return CronSchedule(f"*/{period // 1000} * * * * *")
        return timedelta(milliseconds=period)
    return CronSchedule(loop.schedule.checked(s))


def test_the_schedules_pass_ticks_on_the_clocks_seconds_when_its_interval_allows() -> None:
    on_time = loop_registry.SCHEDULES.schedule.celery(Settings(schedule_scan_interval_ms=2000), CronSchedule)
    assert on_time == CronSchedule("*/2 * * * * *")
    assert next_after("*/2 * * * * *", T0.replace(second=3, microsecond=1)) == T0.replace(
        second=4, microsecond=0
    )
    # An interval that is not whole seconds dividing a minute keeps beat's fixed rate.
    assert loop_registry.SCHEDULES.schedule.celery(
        Settings(schedule_scan_interval_ms=7000), CronSchedule
    ) == timedelta(seconds=7)


def test_beat_schedules_exactly_the_active_loops(deployment: Settings) -> None:
    beat = make_celery(deployment).conf.beat_schedule
    active = loop_registry.active(deployment)
    assert set(beat) == names(active)
    for loop in active:
        entry = beat[loop.name]
        assert entry["task"] == loop.task
        assert entry["options"]["queue"] == loop.queue
        assert entry["schedule"] == expected_schedule(loop, deployment)


def test_every_loop_has_its_celery_task_and_its_pass(deployment: Settings) -> None:
    app = make_celery(deployment)
    for loop in loop_registry.LOOPS:  # registered whether or not this deployment runs it: a stray tick skips
        assert loop.task in app.tasks
    assert set(loop_passes.PASSES) == names(loop_registry.LOOPS)
    assert loop_passes.unbound() == []


def ticker_loops(s: Settings, queues: tuple[str, ...]) -> set[str]:
    rt = cast(Runtime, SimpleNamespace(settings=s))
    return names(loop_passes.LocalTicker(rt, queues).loops)


def test_each_roles_ticker_runs_the_active_loops_of_the_queues_it_consumes(deployment: Settings) -> None:
    active = loop_registry.active(deployment)
    covered: set[str] = set()
    for role in ROLES.values():
        mine = ticker_loops(deployment, role.queues)
        assert mine == {loop.name for loop in active if loop.queue in role.queues}, role.name
        covered |= mine
    # With beat down, every loop this deployment runs is still ticked by some process role ...
    assert covered == names(active)
    # ... the Factory's two by worker-control (and all), the job loops by the driver as well.
    assert {"objective-outbox-redrive"} <= ticker_loops(deployment, ROLES["worker-control"].queues)
    assert not {"objective-outbox-redrive", "objective-watchdog"} & ticker_loops(
        deployment, ROLES["driver"].queues
    )


def test_readyz_checks_exactly_the_active_loops(deployment: Settings, sqlite_engine: Engine) -> None:
    verdict, report = check_loops(sqlite_engine, deployment, time.monotonic())
    assert verdict == "ok"  # nothing ran yet, but a fresh process gives every loop its grace
    assert set(report) == names(loop_registry.active(deployment))
    for loop in loop_registry.active(deployment):
        assert report[loop.name]["intervalMs"] == loop.schedule.period_ms(deployment, datetime.now(UTC))


def test_readyz_fails_on_a_watchdog_cron_that_cannot_run(sqlite_engine: Engine, tmp_path: Path) -> None:
    bad = settings(tmp_path, RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_CRON="61 * * * *")
    verdict, report = check_loops(sqlite_engine, bad, time.monotonic())
    assert verdict.startswith("overdue: objective-watchdog")
    assert "RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_CRON" in report["objective-watchdog"]["error"]


def test_the_watchdog_is_overdue_once_its_third_tick_after_the_last_run_has_passed() -> None:
    loop, s = loop_registry.OBJECTIVE_WATCHDOG, Settings()
    # Last run at 12:00:00.5; ticks follow at 12:01, 12:02 and 12:03.
    assert not loop_registry.status(loop, s, T0, T0, datetime(2026, 1, 1, 12, 2, 59, tzinfo=UTC)).overdue
    assert not loop_registry.status(loop, s, T0, T0, datetime(2026, 1, 1, 12, 3, 0, tzinfo=UTC)).overdue
    late = loop_registry.status(loop, s, T0, T0, datetime(2026, 1, 1, 12, 3, 0, 1, tzinfo=UTC))
    assert late.overdue and late.interval_ms == 60_000 and late.age_ms == 179_500


def metric_labels(body: bytes, family: str) -> dict[str, float]:
    for fam in text_string_to_metric_families(body.decode()):
        if fam.name == family:
            return {s.labels["loop"]: s.value for s in fam.samples if "loop" in s.labels}
    return {}


def test_metrics_carry_exactly_the_declared_loops(deployment: Settings, sqlite_engine: Engine) -> None:
    body, _ = metrics.exposition(sqlite_engine, deployment)
    periods = metric_labels(body, "receipt_loop_interval_seconds")
    now = datetime.now(UTC)
    assert periods == {
        loop.name: loop.schedule.period_ms(deployment, now) / 1000
        for loop in loop_registry.active(deployment)
    }
    counted = set()
    for fam in text_string_to_metric_families(body.decode()):
        if fam.name == "receipt_loop_passes":
            counted |= {(s.labels["loop"], s.labels["outcome"]) for s in fam.samples if "outcome" in s.labels}
    assert counted == {(name, o) for name in names(loop_registry.LOOPS) for o in metrics.LOOP_OUTCOMES}


def test_the_docs_table_is_generated_from_the_registry() -> None:
    assert loop_passes.documented_table() == loop_passes.docs_table(), "run `make docs`"
    for loop in loop_registry.LOOPS:
        assert f"| `{loop.name}` |" in loop_passes.docs_table()


# -- adding a loop is one declaration plus its pass ---------------------------------------------------


@pytest.fixture
def one_more_loop(monkeypatch: pytest.MonkeyPatch) -> Iterator[Loop]:
    extra = Loop(
        name="demo-purge",
        task="receipt.demo_purge",
        queue=MAINTENANCE_QUEUE,
        schedule=Every("lease_expiry_interval_ms"),
        doc="Deletes nothing (a test's loop).",
    )
    monkeypatch.setattr(loop_registry, "LOOPS", (*loop_registry.LOOPS, extra))
    monkeypatch.setattr(loop_passes, "PASSES", dict(loop_passes.PASSES))
    loop_passes.binds(extra)(lambda rt, p: {"purged": 0})
    yield extra


def test_a_new_loop_is_scheduled_registered_ticked_checked_measured_and_documented(
    one_more_loop: Loop, tmp_path: Path, sqlite_engine: Engine
) -> None:
    s = settings(tmp_path)
    app = make_celery(s)
    assert app.conf.beat_schedule["demo-purge"]["task"] == "receipt.demo_purge"
    assert "receipt.demo_purge" in app.tasks
    assert "demo-purge" in ticker_loops(s, ROLES["driver"].queues)
    assert "demo-purge" in check_loops(sqlite_engine, s, time.monotonic())[1]
    body, _ = metrics.exposition(sqlite_engine, s)
    assert metric_labels(body, "receipt_loop_interval_seconds")["demo-purge"] == 5.0
    assert "| `demo-purge` |" in loop_passes.docs_table()


def test_a_declared_loop_without_a_pass_stops_the_celery_app(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    extra = Loop("orphan", "receipt.orphan", MAINTENANCE_QUEUE, Every("lease_expiry_interval_ms"), "x")
    monkeypatch.setattr(loop_registry, "LOOPS", (*loop_registry.LOOPS, extra))
    with pytest.raises(RuntimeError, match="orphan"):
        make_celery(settings(tmp_path))


def test_beat_refuses_to_start_on_a_schedules_file_it_cannot_load(tmp_path: Path) -> None:
    from tasks.beat import prepare

    broken = tmp_path / "schedules.toml"
    broken.write_text('[[schedules]]\nscheduleId = "x"\norganizationId = "acme"\ncron = "every day"\n')
    with pytest.raises(SystemExit, match=r"RECEIPT_SCHEDULES_FILE: .*schedule 1: cron"):
        prepare(settings(tmp_path, RECEIPT_SCHEDULES_FILE=str(broken)))
    missing = tmp_path / "nowhere.json"
    with pytest.raises(SystemExit, match="cannot be read"):
        prepare(settings(tmp_path, RECEIPT_SCHEDULES_FILE=str(missing)))


def test_the_schedules_pass_counts_its_ticks_by_schedule_and_outcome() -> None:
    counter = metrics.registry_metrics().schedule_ticks
    before = counter.labels("acme/nightly", "fired")._value.get()
    missed = counter.labels("acme/nightly", "missed")._value.get()
    metrics.observe_schedules({"acme/nightly": {"fired": 2, "missed": 5, "skipped": 0}}, [120, 900])
    assert counter.labels("acme/nightly", "fired")._value.get() == before + 2
    assert counter.labels("acme/nightly", "missed")._value.get() == missed + 5
