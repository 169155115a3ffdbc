"""Logging: JSON lines carry the job fields; plain lines stay readable."""

from __future__ import annotations

import io
import json
import logging
import threading
from collections.abc import Iterator

import pytest

from app.config import Settings
from app.ops import logs


@pytest.fixture
def captured() -> Iterator[io.StringIO]:
    """Configure logging like a process does, with the one handler writing to a buffer."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    buf = io.StringIO()
    yield buf
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])


def _configure(
    buf: io.StringIO, fmt: str, role: str = "worker-chat", env: dict[str, str] | None = None
) -> None:
    logs.configure(Settings.from_env({"RECEIPT_LOG_FORMAT": fmt, **(env or {})}), role)
    handler = logging.getLogger().handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(buf)


def test_json_lines_carry_every_job_field_inside_a_job(captured: io.StringIO) -> None:
    _configure(captured, "json")
    log = logging.getLogger("receipt.test")
    log.info("outside")
    with logs.bind_job(jobId="j1", fence="j1:attempt:2"):
        logs.update_job(attempt=2, workerId="host:1:ab", org="acme")
        log.warning("inside %s", "a job")
    lines = [json.loads(line) for line in captured.getvalue().splitlines()]
    assert len(lines) == 2
    outside, inside = lines
    assert outside["message"] == "outside" and outside["role"] == "worker-chat"
    assert "jobId" not in outside
    assert inside["message"] == "inside a job" and inside["level"] == "WARNING"
    assert {k: inside[k] for k in logs.JOB_FIELDS} == {
        "jobId": "j1",
        "attempt": 2,
        "fence": "j1:attempt:2",
        "workerId": "host:1:ab",
        "org": "acme",
    }
    assert inside["role"] == "worker-chat" and inside["logger"] == "receipt.test"
    assert "job_suffix" not in inside  # the plain format's helper field stays out of JSON


def test_a_field_not_known_yet_is_null_not_missing(captured: io.StringIO) -> None:
    _configure(captured, "json", role="driver")
    with logs.bind_job(jobId="j2"):
        logging.getLogger("receipt.dispatch").info("driving")
    line = json.loads(captured.getvalue())
    assert line["jobId"] == "j2" and line["role"] == "driver"
    assert line["workerId"] is None and line["fence"] is None


def test_a_handler_thread_started_with_the_copied_context_keeps_the_fields(captured: io.StringIO) -> None:
    import contextvars

    _configure(captured, "json")
    with logs.bind_job(jobId="j3", attempt=1):
        ctx = contextvars.copy_context()
    thread = threading.Thread(target=lambda: ctx.run(logging.getLogger("handler").info, "from the handler"))
    thread.start()
    thread.join(5)
    assert json.loads(captured.getvalue())["jobId"] == "j3"


def test_plain_lines_are_readable_and_name_the_job(captured: io.StringIO) -> None:
    _configure(captured, "plain", role="beat")
    log = logging.getLogger("receipt.loops")
    log.info("expired %d leases", 3)
    with logs.bind_job(jobId="j4", attempt=2):
        log.info("settled")
    first, second = captured.getvalue().splitlines()
    assert first.endswith("INFO    beat receipt.loops: expired 3 leases")
    assert second.endswith("receipt.loops: settled [jobId=j4 attempt=2]")
    assert not first.startswith("{")


def test_celery_banners_are_quiet_in_json_mode_only() -> None:
    from tasks.worker import worker_argv

    plain = Settings.from_env({})
    as_json = Settings.from_env({"RECEIPT_LOG_FORMAT": "json"})
    assert worker_argv(as_json, "driver")[:2] == ["--quiet", "worker"]
    assert worker_argv(plain, "driver")[0] == "worker"  # plain keeps the banner: it says what runs


def test_an_unknown_log_format_is_refused_naming_the_variable_and_values() -> None:
    with pytest.raises(ValueError, match=r"RECEIPT_LOG_FORMAT.*plain, json"):
        Settings.from_env({"RECEIPT_LOG_FORMAT": "xml"})


MARKER = "l0g-marker-5be1"
SECRETS = {
    "RECEIPT_CALLBACK_SECRET": f"whsec_{MARKER}",
    "RECEIPT_METRICS_TOKEN": f"{MARKER}-metrics",
    "REDIS_URL": f"redis://:{MARKER}-redis@cache:6379/0",
    "RECEIPT_RESONATE_CALLBACK_URL": f"https://hooks.example/cb?token={MARKER}-query",
    # Characters a JSON line and a repr escape: the escaped forms are hidden too.
    "RECEIPT_INTEGRATION_PUBLISH_SECRET": f'{MARKER}"quote\\slash',
}


@pytest.mark.parametrize("fmt", ["plain", "json"])
def test_no_secret_setting_is_ever_written_whatever_logs_it(
    captured: io.StringIO, fmt: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Message, arguments, exception text, stack and extra fields: every secret is ``***``."""
    _configure(captured, fmt, env=SECRETS)
    log = logging.getLogger("some.library")
    log.warning("connecting to %s", SECRETS["REDIS_URL"])
    log.info(
        "posting to %s",
        "/cb?token=" + MARKER + "-query",
        extra={"target": SECRETS["RECEIPT_RESONATE_CALLBACK_URL"]},
    )
    try:
        raise ConnectionError(f"Max retries exceeded with url: /cb?token={MARKER}-query")
    except ConnectionError:
        log.exception("callback failed")
    log.info("token is %(token)s", {"token": SECRETS["RECEIPT_METRICS_TOKEN"]})
    log.error("signing with " + SECRETS["RECEIPT_CALLBACK_SECRET"], stack_info=True)
    log.info("celery-style", extra={"data": {"exc": f"Error('{MARKER}-metrics')", "n": [f"{MARKER}-query"]}})
    log.info("held %s", [SECRETS["RECEIPT_INTEGRATION_PUBLISH_SECRET"], SECRETS["RECEIPT_METRICS_TOKEN"]])
    log.info("a bad format %d", SECRETS["RECEIPT_METRICS_TOKEN"])  # logging's own error report
    written = captured.getvalue()
    assert MARKER not in written, written
    reported = capsys.readouterr().err
    assert "--- Logging error ---" in reported and "a bad format" in reported
    assert MARKER not in reported, reported
    assert written.count("***") >= 5
    assert "connecting to redis://:***@cache:6379/0" in written
    assert "Max retries exceeded with url: /cb?***" in written  # the traceback is kept, hidden
    assert "ConnectionError" in written


def test_without_secrets_records_pass_untouched(captured: io.StringIO) -> None:
    _configure(captured, "plain")
    logging.getLogger("receipt.test").info("plain %s", "text")
    assert captured.getvalue().rstrip().endswith("receipt.test: plain text")


TICK_LINES = {
    logs.TICK_PASSES: (logging.DEBUG, "loop due-retries: pass started"),
    "celery.beat": (logging.INFO, "Scheduler: Sending due task due-retries (receipt.dispatch_due_retries)"),
    "celery.worker.strategy": (logging.INFO, "Task receipt.dispatch_due_retries[t1] received"),
    "celery.app.trace": (
        logging.INFO,
        "Task receipt.dispatch_due_retries[t1] succeeded in 0.07s: <redacted>",
    ),
}


@pytest.fixture
def tick_loggers() -> Iterator[None]:
    saved = {name: logging.getLogger(name).level for name in TICK_LINES}
    yield
    for name, level in saved.items():
        logging.getLogger(name).setLevel(level)


def _tick(buf: io.StringIO) -> str:
    for name, (level, message) in TICK_LINES.items():
        logging.getLogger(name).log(level, message)
    logging.getLogger("celery.app.trace").error("Task receipt.execute[t2] raised unexpected: boom")
    return buf.getvalue()


@pytest.mark.usefixtures("tick_loggers")
def test_per_tick_lines_are_held_back_at_the_default_level_and_failures_are_not(
    captured: io.StringIO,
) -> None:
    """Quiet when idle: a loop's pass, beat's send and Celery's per-task pair write nothing at INFO."""
    _configure(captured, "plain")
    text = _tick(captured)
    assert [m for _, m in TICK_LINES.values() if m in text] == []
    assert "raised unexpected: boom" in text


@pytest.mark.usefixtures("tick_loggers")
@pytest.mark.parametrize("env", [{"RECEIPT_LOG_TICKS": "enabled"}, {"RECEIPT_LOG_LEVEL": "DEBUG"}])
def test_per_tick_lines_are_shown_with_log_ticks_or_at_debug(
    captured: io.StringIO, env: dict[str, str]
) -> None:
    _configure(captured, "plain", env=env)
    text = _tick(captured)
    assert [m for _, m in TICK_LINES.values() if m not in text] == []


@pytest.mark.usefixtures("tick_loggers")
def test_a_level_above_warning_holds_the_tick_loggers_there_too(captured: io.StringIO) -> None:
    _configure(captured, "plain", env={"RECEIPT_LOG_LEVEL": "ERROR"})
    logging.getLogger("celery.beat").warning("beat: a warning")
    assert "a warning" not in captured.getvalue()
