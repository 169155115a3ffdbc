"""Process roles and the worker command line (spec: "Who executes a job").

Five role names; anything else resolves to ``all`` (maintenance only, parks) with a loud warning
naming the five; ``RECEIPT_RESONATE_EXECUTE_CONCURRENCY`` overrides every role's default.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

from app.config import Settings
from app.jobs.routing import DRIVER_QUEUE, MAINTENANCE_QUEUE, OBJECTIVES_QUEUE, QUEUES
from app.ops import outages, preflight
from tasks import worker
from tasks.worker import worker_argv
from workers.roles import ROLE_NAMES, ROLES, concurrency, resolve_role, unknown_role_warning

SPEC_ROLES = ("api", "driver", "worker-chat", "worker-codex", "worker-control")
WORKER_ROLES = [r for r in SPEC_ROLES if r != "api"]

# Which queues each role consumes: each worker group its own queue; the beat-scheduled loops on
# receipt-maintenance, consumed by driver, worker-control and all; the objective-control
# outbox redrive on receipt-objectives, consumed by worker-control and all only (spec).
EXPECTED_QUEUES = {
    "api": (),
    "driver": (DRIVER_QUEUE, MAINTENANCE_QUEUE),
    "worker-chat": (QUEUES["chat"],),
    "worker-codex": (QUEUES["codex"],),
    "worker-control": (QUEUES["control"], MAINTENANCE_QUEUE, OBJECTIVES_QUEUE),
    "all": (MAINTENANCE_QUEUE, OBJECTIVES_QUEUE),
}


def settings(env: dict[str, str] | None = None) -> Settings:
    return Settings.from_env(env or {})


def arg(argv: list[str], flag: str) -> str:
    return argv[argv.index(flag) + 1]


def test_exactly_the_five_spec_role_names() -> None:
    assert ROLE_NAMES == SPEC_ROLES
    assert set(ROLES) == {*SPEC_ROLES, "all"}


@pytest.mark.parametrize("name", SPEC_ROLES)
def test_each_role_resolves_to_itself_and_is_recognised(name: str) -> None:
    role, known = resolve_role(name)
    assert (role.name, known) == (name, True)
    assert role.queues == EXPECTED_QUEUES[name]


def test_queue_names_are_the_spec_groups() -> None:
    assert (QUEUES["chat"], QUEUES["codex"], QUEUES["control"]) == (
        "receipt-chat",
        "receipt-codex",
        "receipt-control",
    )
    assert DRIVER_QUEUE == "receipt-driver"
    assert MAINTENANCE_QUEUE == "receipt-maintenance"


@pytest.mark.parametrize("raw", ["worker_chat", "Driver", "workers-chat", "", None, "  ", "chat"])
def test_misspelled_role_resolves_to_all_consuming_only_maintenance(raw: str | None) -> None:
    role, known = resolve_role(raw)
    assert role.name == "all"
    assert known is False
    assert role.queues == (MAINTENANCE_QUEUE, OBJECTIVES_QUEUE)


def test_all_spelled_out_is_recognised_but_still_maintenance_only() -> None:
    role, known = resolve_role("all")
    assert (role.name, known, role.queues) == ("all", True, (MAINTENANCE_QUEUE, OBJECTIVES_QUEUE))


def test_unknown_role_warning_names_the_value_and_all_five_roles() -> None:
    text = unknown_role_warning("wroker-chat")
    assert "'wroker-chat'" in text
    assert "all" in text
    for name in SPEC_ROLES:
        assert name in text


def test_surrounding_whitespace_is_tolerated() -> None:
    assert resolve_role("  worker-codex \n") == (ROLES["worker-codex"], True)


@pytest.mark.parametrize("name", [*SPEC_ROLES, "all"])
def test_execute_concurrency_override_beats_every_default(name: str) -> None:
    role = ROLES[name]
    assert concurrency(role, 13) == 13
    assert concurrency(role, None) == max(1, role.default_concurrency)


def test_defaults_keep_codex_scarce_and_the_driver_wide() -> None:
    # Codex runs hour-long subprocesses; the driver only reads, decides and sends.
    assert concurrency(ROLES["worker-codex"], None) < concurrency(ROLES["worker-chat"], None)
    assert concurrency(ROLES["driver"], None) >= concurrency(ROLES["worker-chat"], None)


def test_non_positive_override_falls_back_to_the_default() -> None:
    assert concurrency(ROLES["worker-chat"], 0) == ROLES["worker-chat"].default_concurrency


@pytest.mark.parametrize("name", WORKER_ROLES)
def test_worker_argv_consumes_the_roles_queues_with_threads(name: str) -> None:
    argv = worker_argv(settings(), name)
    assert argv[0] == "worker"
    assert tuple(arg(argv, "--queues").split(",")) == EXPECTED_QUEUES[name]
    assert arg(argv, "--pool") == "threads"
    assert int(arg(argv, "--concurrency")) == ROLES[name].default_concurrency
    assert arg(argv, "--hostname").startswith(f"{name}@")


@pytest.mark.parametrize("name", WORKER_ROLES)
def test_worker_argv_concurrency_comes_from_the_environment_override(name: str) -> None:
    argv = worker_argv(settings({"RECEIPT_RESONATE_EXECUTE_CONCURRENCY": "17"}), name)
    assert arg(argv, "--concurrency") == "17"


def test_worker_argv_for_a_misspelled_role_consumes_only_maintenance() -> None:
    argv = worker_argv(settings(), "worker-chats")
    assert arg(argv, "--queues") == f"{MAINTENANCE_QUEUE},{OBJECTIVES_QUEUE}"
    assert arg(argv, "--hostname").startswith("all@")


def test_api_role_refuses_to_start_a_worker() -> None:
    with pytest.raises(SystemExit, match="api"):
        worker_argv(settings(), "api")


class _FakeApp:
    def __init__(self) -> None:
        self.argv: list[str] | None = None

    def worker_main(self, argv: list[str]) -> None:
        self.argv = argv


@pytest.fixture(autouse=True)
def checked(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """``main``'s start-up checks and outage watch, recorded instead of run (no database here; the
    real checks run in tests/integration/test_preflight.py)."""
    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(preflight, "require", lambda _settings, **kw: calls.append(kw))
    monkeypatch.setattr(outages, "install", lambda _settings, **kw: calls.append({"watch": True}))
    return calls


def test_main_checks_the_database_schema_and_the_broker_before_starting(
    monkeypatch: pytest.MonkeyPatch, checked: list[dict[str, Any]]
) -> None:
    fake = _FakeApp()
    monkeypatch.setattr(worker, "make_celery", lambda _s: fake)
    monkeypatch.setattr("app.ops.logs.configure", lambda *_: None)
    worker.main(["--role", "driver"])
    assert checked == [
        {"database": preflight.Schema.HEAD, "broker": True, "log": worker.log},
        {"watch": True},
    ]
    assert fake.argv is not None


def test_main_with_a_misspelled_role_warns_loudly_and_starts_maintenance_only(
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = _FakeApp()
    monkeypatch.setattr(worker, "make_celery", lambda _s: fake)
    monkeypatch.setattr("app.ops.logs.configure", lambda *_: None)
    monkeypatch.setenv("RECEIPT_PROCESS_ROLE", "wroker-codex")
    with caplog.at_level(logging.WARNING, logger="receipt.worker"):
        worker.main([])
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    for name in SPEC_ROLES:
        assert name in warnings[0].getMessage()
    assert fake.argv is not None
    assert arg(fake.argv, "--queues") == f"{MAINTENANCE_QUEUE},{OBJECTIVES_QUEUE}"


def test_main_role_flag_overrides_the_environment(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake = _FakeApp()
    monkeypatch.setattr(worker, "make_celery", lambda _s: fake)
    monkeypatch.setattr("app.ops.logs.configure", lambda *_: None)
    monkeypatch.setenv("RECEIPT_PROCESS_ROLE", "driver")
    with caplog.at_level(logging.WARNING, logger="receipt.worker"):
        worker.main(["--role", "worker-codex"])
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert fake.argv is not None
    assert arg(fake.argv, "--queues") == QUEUES["codex"]


def test_main_refuses_the_api_role(monkeypatch: pytest.MonkeyPatch, checked: list[dict[str, Any]]) -> None:
    calls: list[Any] = []

    def make_celery(settings: Any) -> _FakeApp:
        calls.append(settings)
        return _FakeApp()

    monkeypatch.setattr(worker, "make_celery", make_celery)
    monkeypatch.setattr("app.ops.logs.configure", lambda *_: None)
    with pytest.raises(SystemExit):
        worker.main(["--role", "api"])
    assert calls == [] and checked == []  # refused before any check or Celery app
