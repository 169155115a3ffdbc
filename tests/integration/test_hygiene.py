"""Hygiene: no secret in logs or on screen, private files from their first byte."""

from __future__ import annotations

import json
import logging
import os
import stat
from pathlib import Path
from typing import Any

import pytest
from celery import signals
from celery.app import trace
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError

from app.config import SETTINGS, Settings, mask_url
from app.ops.cli import main
from app.ops.supervisor import _prepare
from app.storage import tokens
from app.storage.db import api_tokens, make_engine, transaction
from tasks import redaction

Capture = pytest.CaptureFixture[str]


def test_sql_errors_never_carry_their_parameters(engine: Engine) -> None:
    info, _secret = tokens.create(engine, "org-1")
    with pytest.raises(IntegrityError) as err, transaction(engine) as conn:
        conn.execute(
            api_tokens.insert().values(
                id=info.id,
                organization_id="SECRET-ORG-VALUE",
                token_hash="SECRET-HASH",
                system=False,
                created_at=info.created_at,
            )
        )
    text = str(err.value)
    assert "SECRET" not in text
    assert "hidden due to hide_parameters" in text


def test_celery_never_logs_a_tasks_return_value_or_arguments(caplog: pytest.LogCaptureFixture) -> None:
    redaction.install()
    context = {
        "id": "t1",
        "name": "receipt.execute",
        "runtime": 0.1,
        "return_value": "RETURN-SECRET",
        "args": "['ARG-SECRET']",
        "kwargs": "{'k': 'KWARG-SECRET'}",
        "description": "raised",
        "exc": "x",
    }
    # The loggers' own levels too: a process configured with the defaults holds these INFO lines back.
    with (
        caplog.at_level(logging.INFO),
        caplog.at_level(logging.INFO, logger="celery.app.trace"),
        caplog.at_level(logging.INFO, logger="celery.worker.strategy"),
    ):
        logging.getLogger("celery.app.trace").info(
            trace.LOG_SUCCESS, dict(context), extra={"data": dict(context)}
        )
        logging.getLogger("celery.app.trace").error(
            trace.LOG_FAILURE, dict(context), extra={"data": dict(context)}
        )
        logging.getLogger("celery.worker.strategy").info(
            trace.LOG_RECEIVED, dict(context), extra={"data": dict(context)}
        )
    assert len(caplog.records) == 3
    for record in caplog.records:
        shown = record.getMessage() + json.dumps(record.data, default=str)  # type: ignore[attr-defined]
        assert "SECRET" not in shown, shown
    assert caplog.records[0].getMessage() == "Task receipt.execute[t1] succeeded in 0.1s: <redacted>"


def test_published_tasks_carry_no_argument_representation() -> None:
    redaction.install()
    headers: dict[str, Any] = {"argsrepr": "['job-1']", "kwargsrepr": "{}"}
    signals.before_task_publish.send(sender="receipt.execute", body=(), headers=headers)
    assert headers == {"argsrepr": "<redacted>", "kwargsrepr": "<redacted>"}


def test_receipt_config_shows_stars_for_passwords_and_tokens(
    monkeypatch: pytest.MonkeyPatch, capsys: Capture
) -> None:
    secrets = {
        "DATABASE_URL": "postgresql://receipt:db-hunter2@db.internal:5432/receipt",
        "REDIS_URL": "redis://:redis-hunter2@cache:6379/0",
        "RECEIPT_CALLBACK_TOKEN": "callback-hunter2",
        "RECEIPT_CALLBACK_SECRET": "whsec_signing-hunter2",
        "RECEIPT_INTEGRATION_PUBLISH_SECRET": "publish-hunter2",
        "RECEIPT_METRICS_TOKEN": "metrics-hunter2",
        "RECEIPT_RESONATE_CALLBACK_URL": "https://hooks:cb-hunter2@example.com/cb?token=query-hunter2",
        "RECEIPT_INTEGRATION_PUBLISH_URL": "https://ci:publish-url-hunter2@ci.example/publish",
        "RECEIPT_EVENT_CALLBACK_URL": "https://example.com/events",
    }
    for name, value in secrets.items():
        monkeypatch.setenv(name, value)
    assert main(["config"]) == 0
    printed = capsys.readouterr().out
    assert "hunter2" not in printed
    shown = json.loads(printed)
    assert shown["database_url"] == "postgresql://receipt:***@db.internal:5432/receipt"
    assert shown["redis_url"] == "redis://:***@cache:6379/0"
    for name in ("callback_token", "callback_secret", "integration_publish_secret", "metrics_token"):
        assert shown[name] == "***", name
    assert shown["callback_url"] == "https://hooks:***@example.com/cb?***"
    assert shown["integration_publish_url"] == "https://ci:***@ci.example/publish"
    assert shown["event_callback_url"] == "https://example.com/events"  # nothing secret: unchanged
    assert shown["codex_user"] == "nobody"


def test_receipt_config_hides_every_setting_marked_secret(
    monkeypatch: pytest.MonkeyPatch, capsys: Capture
) -> None:
    """Whatever secret is declared, now or later: each one set to a marker, none printed."""
    for s in SETTINGS:
        if s.secret:
            monkeypatch.setenv(s.env, f"marker-{s.attr}-7d1e")
        elif s.url:
            monkeypatch.setenv(s.env, f"https://u:marker-{s.attr}-7d1e@example.com/x?k=marker-q-7d1e")
    assert main(["config"]) == 0
    assert "7d1e" not in capsys.readouterr().out


def test_mask_url_leaves_urls_without_secrets_alone() -> None:
    assert mask_url("sqlite:////tmp/x.db") == "sqlite:////tmp/x.db"
    assert mask_url("redis://cache:6379/0") == "redis://cache:6379/0"
    assert mask_url("redis://token@cache:6379/0") == "redis://***@cache:6379/0"


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def open_umask() -> Any:
    """The most permissive umask: the modes below must not depend on the caller's."""
    old = os.umask(0)
    yield
    os.umask(old)


def test_receipt_home_is_0700_and_database_and_dev_token_0600_from_the_first_byte(
    tmp_path: Path, open_umask: None
) -> None:
    home = tmp_path / "deep" / "home"
    settings = Settings(home=str(home))
    secret = _prepare(settings)
    assert _mode(home) == 0o700
    assert _mode(home / "receipt.db") == 0o600
    assert _mode(home / "dev-token") == 0o600
    assert (home / "dev-token").read_text().strip() == secret
    # "From the first byte": the engine creates the database file itself, 0600, before SQLite writes.
    other = tmp_path / "other"
    engine = make_engine(f"sqlite:///{other / 'receipt.db'}")
    assert _mode(other) == 0o700 and _mode(other / "receipt.db") == 0o600
    assert (other / "receipt.db").stat().st_size == 0
    engine.dispose()


def test_a_wider_dev_token_file_is_narrowed_when_rewritten(tmp_path: Path, open_umask: None) -> None:
    home = tmp_path / "home"
    settings = Settings(home=str(home))
    _prepare(settings)
    token_file = home / "dev-token"
    token_file.write_text("rcpt_not-a-valid-token\n")
    token_file.chmod(0o644)
    secret = _prepare(settings)  # the old one no longer authenticates: a new token is written
    assert secret != "rcpt_not-a-valid-token"
    assert _mode(token_file) == 0o600


def test_the_dev_token_may_run_commands_only_where_commands_are_enabled(tmp_path: Path) -> None:
    home = tmp_path / "home"
    off = _prepare(Settings(home=str(home)))
    engine = make_engine(Settings(home=str(home)).sqlalchemy_url)
    with engine.connect() as conn:
        info = tokens.authenticate(conn, off)
    assert info is not None and info.scopes == ()
    assert _prepare(Settings(home=str(home))) == off  # reused while it matches
    on = _prepare(Settings(home=str(home), codex_commands=True))
    with engine.connect() as conn:
        assert tokens.authenticate(conn, off) is None  # replaced, and revoked
        info = tokens.authenticate(conn, on)
    assert info is not None and info.scopes == ("commands",)
    engine.dispose()
