"""Once per outage (app/ops/outages.py): a lost dependency is one log line, its return one more, and
the retry loops' own records about it are dropped meanwhile. Probes are stand-ins here; the real
checks against a killed redis-server run in tests/e2e/test_outages.py."""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis.exceptions as rex
from sqlalchemy.exc import OperationalError

from app.config import Settings
from app.ops import logs, outages
from app.ops.outages import OutageFilter, Watch
from app.ops.preflight import BROKER, DATABASE, Problem
from tests.support.waiting import wait_for

DOWN = Problem(
    DATABASE,
    "DATABASE_URL=postgresql://receipt:***@db:5432/jobs",
    "no PostgreSQL answers at db:5432 (connection refused)",
    "start PostgreSQL there, or set DATABASE_URL to a server that runs",
)
LOST_LINE = (
    "DATABASE_URL=postgresql://receipt:***@db:5432/jobs: lost — no PostgreSQL answers at db:5432 "
    "(connection refused); start PostgreSQL there, or set DATABASE_URL to a server that runs "
    "(retrying every 60 s; one more line when it answers)"
)


class Switch:
    """A probe whose answer the test sets, counting how often it is asked."""

    def __init__(self, problem: Problem | None = None) -> None:
        self.problem = problem
        self.calls = 0
        self.asked = threading.Event()

    def __call__(self) -> Problem | None:
        self.calls += 1
        self.asked.set()
        return self.problem


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def probe() -> Switch:
    return Switch()


@pytest.fixture
def watch(probe: Switch, clock: Clock) -> Iterator[Watch]:
    # A retry interval far past the test: only the test's own calls move the watch.
    made = Watch({DATABASE: probe}, retry_s=60, clock=clock)
    yield made
    made.stop()


def outage_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == outages.LOGGER]


def test_the_first_confirmed_failure_is_one_line_and_later_ones_are_silent(
    watch: Watch, probe: Switch, caplog: pytest.LogCaptureFixture
) -> None:
    probe.problem = DOWN
    with caplog.at_level(logging.INFO, logger=outages.LOGGER):
        assert [watch.suspect(DATABASE) for _ in range(5)] == [True] * 5
    assert probe.calls == 1  # confirmed once; known down afterwards
    assert outage_lines(caplog) == [LOST_LINE]
    assert [r.levelname for r in caplog.records] == ["ERROR"]
    outage = watch.down(DATABASE)
    assert outage is not None and outage.problem == DOWN


def test_its_return_is_one_more_line_with_the_outage_length(
    watch: Watch, probe: Switch, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    probe.problem = DOWN
    with caplog.at_level(logging.INFO, logger=outages.LOGGER):
        watch.suspect(DATABASE)
        clock.now += 12.34
        watch.observe(DATABASE, None)
        watch.observe(DATABASE, None)  # still up: nothing more to say
    assert outage_lines(caplog) == [
        LOST_LINE,
        "DATABASE_URL=postgresql://receipt:***@db:5432/jobs: answers again after 12.3 s",
    ]
    assert watch.down(DATABASE) is None


def test_a_failure_that_the_probe_does_not_confirm_is_no_outage(
    watch: Watch, probe: Switch, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger=outages.LOGGER):
        assert watch.suspect(DATABASE) is False  # a deadlock, one dropped connection: it answers
        assert watch.suspect(DATABASE) is False
        assert probe.calls == 1  # found healthy a moment ago: not probed again
        clock.now += outages.HEALTHY_FOR_S
        assert watch.suspect(DATABASE) is False
        assert probe.calls == 2
    assert outage_lines(caplog) == []


def test_an_unwatched_dependency_is_never_suspected(watch: Watch) -> None:
    assert watch.suspect(BROKER) is False
    watch.observe(BROKER, DOWN)
    assert watch.down(BROKER) is None


def test_the_retry_thread_finds_the_return_by_itself(caplog: pytest.LogCaptureFixture) -> None:
    probe = Switch(DOWN)
    watch = Watch({DATABASE: probe}, retry_s=0.02)
    try:
        with caplog.at_level(logging.INFO, logger=outages.LOGGER):
            assert watch.suspect(DATABASE)
            wait_for(lambda: probe.calls >= 3, 10, what="the retry thread's probes")
            probe.problem = None
            wait_for(lambda: watch.down(DATABASE) is None, 10, what="the return to be noticed")
        lines = outage_lines(caplog)
        assert len(lines) == 2 and "lost —" in lines[0] and "answers again after" in lines[1]
    finally:
        watch.stop()


# -- the log filter ------------------------------------------------------------------------------------


def db_error() -> OperationalError:
    return OperationalError("SELECT 1", {}, Exception("server closed the connection unexpectedly"))


def record(
    msg: str, *args: object, exc: BaseException | None = None, name: str = "receipt.loops"
) -> logging.LogRecord:
    exc_info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord(name, logging.WARNING, __file__, 1, msg, args, exc_info)


def test_records_are_classified_by_the_exception_they_carry() -> None:
    assert outages.classify(record("pass failed", exc=db_error())) == DATABASE
    assert outages.classify(record("ticker: %s", db_error())) == DATABASE
    refused = rex.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")
    assert outages.classify(record("wake listener: %s; again in %.1f s", refused, 2.0)) == BROKER
    try:
        try:
            raise refused
        except rex.ConnectionError as inner:
            raise RuntimeError("publish failed") from inner
    except RuntimeError as wrapped:
        assert outages.classify(record("beat: could not apply", exc=wrapped)) == BROKER
    assert outages.classify(record("job %s failed: %s", "j1", ValueError("bad input"))) is None
    assert outages.classify(record("plain line")) is None


@pytest.fixture
def installed(probe: Switch, clock: Clock) -> Iterator[Watch]:
    watch = outages.use(Watch({DATABASE: probe}, retry_s=60, clock=clock))
    yield watch
    outages.uninstall()


def test_the_filter_drops_records_about_a_dependency_that_is_down(installed: Watch, probe: Switch) -> None:
    keep = OutageFilter()
    assert keep.filter(record("unrelated")) is True
    assert keep.filter(record("ticker: %s", db_error())) is True  # the probe says it answers
    probe.problem = DOWN
    installed.observe(DATABASE, DOWN)
    assert keep.filter(record("ticker: %s", db_error())) is False
    assert keep.filter(record("pass failed", exc=db_error())) is False
    assert keep.filter(record("unrelated")) is True
    # The watch's own lines always pass.
    assert keep.filter(record("%s: lost", "DATABASE_URL", name=outages.LOGGER)) is True


def test_without_a_watch_the_filter_passes_everything() -> None:
    outages.uninstall()
    assert OutageFilter().filter(record("ticker: %s", db_error())) is True


@pytest.fixture
def process_log(tmp_path: Path) -> Iterator[io.StringIO]:
    """Logging configured as a process configures it (app/ops/logs.py), writing to a buffer."""
    root = logging.getLogger()
    saved = (root.handlers[:], root.level)
    buf = io.StringIO()
    logs.configure(Settings.from_env({"RECEIPT_HOME": str(tmp_path)}), "driver")
    handler = root.handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(buf)
    yield buf
    root.handlers[:] = saved[0]
    root.setLevel(saved[1])


def test_a_process_log_shows_one_line_per_outage_whatever_the_retries(
    installed: Watch, probe: Switch, clock: Clock, process_log: io.StringIO
) -> None:
    ticker = logging.getLogger("receipt.loops")
    probe.problem = DOWN
    for attempt in range(20):  # a retry loop failing twenty times
        ticker.warning("local ticker could not check the loops: %s", db_error())
        ticker.info("attempt %d over", attempt)
    clock.now += 3
    installed.observe(DATABASE, None)
    ticker.warning("local ticker could not check the loops: %s", db_error())  # found answering: shown
    lines = process_log.getvalue().splitlines()
    about = [line for line in lines if "DATABASE_URL" in line or "could not check" in line]
    assert len(about) == 3, about
    assert " ERROR   driver receipt.outage: " in about[0]
    assert [line.split("receipt.outage: ", 1)[1] for line in about[:2]] == [
        LOST_LINE,
        "DATABASE_URL=postgresql://receipt:***@db:5432/jobs: answers again after 3.0 s",
    ]
    assert "local ticker could not check the loops: (builtins.Exception) server closed" in about[2]
    assert sum("attempt" in line for line in lines) == 20  # nothing else was dropped
