"""gunicorn's access line (api/access_log.py): written only with RECEIPT_ACCESS_LOG=enabled.

Off by default, the per-request line is skipped before gunicorn builds it; requests are counted in
``receipt_http_requests_total`` (tests/integration/api/test_metrics.py). gunicorn's error lines are
unchanged either way.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
from gunicorn.config import Config
from gunicorn.glogging import Logger

from api import access_log
from app.config import Settings
from app.ops import logs


def gunicorn_logger(settings: Settings) -> Logger:
    """The logger gunicorn builds from api/gunicorn_conf.py's two logging settings."""
    cfg = Config()
    cfg.set("logconfig_dict", logs.dict_config(settings, "web"))
    cfg.set("logger_class", access_log.logger_class(settings))
    logger: Logger = cfg.logger_class(cfg)
    return logger


class Lines(logging.Handler):
    """The records reaching the root logger (gunicorn's dictConfig replaces pytest's handlers)."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture
def lines() -> Iterator[Lines]:
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    caught = Lines()
    yield caught
    root.handlers[:] = saved
    root.setLevel(level)


def listen(caught: Lines) -> None:
    logging.getLogger().addHandler(caught)


def answer(logger: Logger) -> None:
    """One request answered, as gunicorn's worker reports it."""
    resp = SimpleNamespace(status="202 Accepted", sent=120, response_length=120, headers=[])
    req = SimpleNamespace(headers=[], method="POST", path="/agents/noop/jobs", query="", version=(1, 1))
    environ = {
        "REMOTE_ADDR": "127.0.0.1",
        "REQUEST_METHOD": "POST",
        "RAW_URI": "/agents/noop/jobs",
        "PATH_INFO": "/agents/noop/jobs",
        "QUERY_STRING": "",
        "SERVER_PROTOCOL": "HTTP/1.1",
    }
    logger.access(resp, req, environ, datetime.timedelta(milliseconds=3))


@pytest.mark.parametrize(("setting", "written"), [("disabled", 0), ("enabled", 1)])
def test_the_access_line_is_written_only_when_enabled(lines: Lines, setting: str, written: int) -> None:
    settings = Settings.from_env({"RECEIPT_ACCESS_LOG": setting})
    assert settings.access_log is (setting == "enabled")
    logger = gunicorn_logger(settings)
    listen(lines)
    answer(logger)
    access = [r for r in lines.records if r.name == "gunicorn.access"]
    assert len(access) == written
    if written:
        assert "/agents/noop/jobs" in access[0].getMessage()


def test_access_lines_are_off_by_default_and_error_lines_stay(lines: Lines) -> None:
    settings = Settings.from_env({})
    assert settings.access_log is False
    logger = gunicorn_logger(settings)
    assert isinstance(logger, access_log.QuietAccessLogger)
    listen(lines)
    answer(logger)
    logger.error("worker timeout")
    assert [r.getMessage() for r in lines.records if r.name.startswith("gunicorn")] == ["worker timeout"]
