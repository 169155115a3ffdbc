"""The start-up checks' words (app/ops/preflight.py): each failure is one line naming the setting,
what was tried with the password hidden, and what to do. No server here: the errors are built as
the drivers raise them, and the schema checks run on SQLite files."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis.exceptions as rex
from sqlalchemy import text

from app.config import Settings
from app.ops import preflight
from app.ops.preflight import Problem, Schema
from app.storage.db import make_engine
from app.storage.migrate import upgrade
from app.storage.revisions import head

REFUSED = (
    'connection to server at "10.0.0.5", port 5433 failed: Connection refused\n'
    "\tIs the server running on that host and accepting TCP/IP connections?"
)


def settings(tmp_path: Path, **env: str) -> Settings:
    return Settings.from_env({"RECEIPT_HOME": str(tmp_path / "home"), **env})


@pytest.mark.parametrize(
    ("message", "what", "fix"),
    [
        (
            REFUSED,
            "no PostgreSQL answers at 10.0.0.5:5433 (connection refused)",
            "start PostgreSQL there, or set DATABASE_URL to a server that runs",
        ),
        (
            'connection to server at "10.0.0.5", port 5433 failed: FATAL:  role "nobody" does not exist',
            'PostgreSQL at 10.0.0.5:5433 refused the login (role "nobody" does not exist)',
            "check the user and password in DATABASE_URL (the password is hidden here)",
        ),
        (
            'connection to server at "10.0.0.5", port 5433 failed: FATAL:  password authentication failed '
            'for user "receipt"',
            "PostgreSQL at 10.0.0.5:5433 refused the login "
            '(password authentication failed for user "receipt")',
            "check the user and password in DATABASE_URL (the password is hidden here)",
        ),
        (
            'connection to server at "10.0.0.5", port 5433 failed: FATAL:  database "jobs" does not exist',
            "PostgreSQL at 10.0.0.5:5433 has no database 'jobs'",
            "create it (CREATE DATABASE jobs) and run `receipt migrate` (the Procfile's release step), "
            "or correct the name in DATABASE_URL",
        ),
        (
            'connection to server at "10.0.0.5", port 5433 failed: timeout expired',
            "no answer from 10.0.0.5:5433 within 3 s",
            "check the host, the port and any firewall between",
        ),
        (
            'connection to server at "10.0.0.5", port 5433 failed: server closed the connection unexpectedly',
            "PostgreSQL at 10.0.0.5:5433 closed the connection (restarting, or cut off on the way)",
            "check that PostgreSQL runs there and nothing between drops connections",
        ),
        (
            'connection to server at "10.0.0.5", port 5433 failed: '
            "FATAL:  the database system is starting up",
            "PostgreSQL at 10.0.0.5:5433 is not accepting connections (the database system is starting up)",
            "wait for it to finish, then retry",
        ),
        (
            "something nobody foresaw\nsecond line",
            "cannot use the database (something nobody foresaw)",
            "check DATABASE_URL",
        ),
    ],
)
def test_each_database_error_becomes_what_went_wrong_and_what_to_do(
    message: str, what: str, fix: str
) -> None:
    assert preflight.describe_database_error(Exception(message), "10.0.0.5", 5433, "jobs") == (what, fix)


@pytest.mark.parametrize(
    ("exc", "what", "fix"),
    [
        (
            rex.ConnectionError("Error 111 connecting to 10.0.0.6:6380. Connection refused."),
            "no Redis answers at 10.0.0.6:6380 (connection refused)",
            "start redis-server there, or set REDIS_URL to a server that runs",
        ),
        (
            rex.AuthenticationError("invalid username-password pair or user is disabled."),
            "Redis at 10.0.0.6:6380 refused the login (invalid username-password pair or user is disabled.)",
            "check the password (and user) in REDIS_URL (the password is hidden here)",
        ),
        (
            rex.TimeoutError("Timeout connecting to server"),
            "no answer from 10.0.0.6:6380 within 3 s",
            "check the host, the port and any firewall between",
        ),
        (
            rex.ResponseError("DB index is out of range"),
            "Redis at 10.0.0.6:6380 has no such database number",
            "use a database number the server has (0-15 unless it is configured otherwise)",
        ),
    ],
)
def test_each_broker_error_becomes_what_went_wrong_and_what_to_do(
    exc: BaseException, what: str, fix: str
) -> None:
    assert preflight.describe_broker_error(exc, "10.0.0.6", 6380) == (what, fix)


def test_a_host_name_that_does_not_resolve_is_named() -> None:
    db = Exception('could not translate host name "db.internal" to address: Name or service not known')
    assert preflight.describe_database_error(db, "db.internal", None, "jobs") == (
        "the host name 'db.internal' does not resolve",
        "correct the host in DATABASE_URL",
    )
    broker = rex.ConnectionError("Error -2 connecting to cache.internal:6379. Name or service not known.")
    assert preflight.describe_broker_error(broker, "cache.internal", None) == (
        "the host name 'cache.internal' does not resolve",
        "correct the host in REDIS_URL",
    )


def test_a_problem_is_one_line_naming_the_setting_and_hiding_the_password(tmp_path: Path) -> None:
    found = preflight.database_problem(
        settings(tmp_path, DATABASE_URL="mysql://receipt:s3cret@db.example/jobs")
    )
    assert found == Problem(
        "DATABASE_URL",
        "DATABASE_URL=mysql://receipt:***@db.example/jobs",
        "unsupported scheme 'mysql' (Receipt runs on PostgreSQL)",
        "set it to postgresql://USER:PASSWORD@HOST:PORT/DATABASE, or unset it for the embedded SQLite file",
    )
    assert found.line() == (
        "DATABASE_URL=mysql://receipt:***@db.example/jobs: unsupported scheme 'mysql' (Receipt runs on "
        "PostgreSQL); set it to postgresql://USER:PASSWORD@HOST:PORT/DATABASE, or unset it for the "
        "embedded SQLite file"
    )
    assert "s3cret" not in found.line() and "\n" not in found.line()


@pytest.mark.parametrize(
    ("url", "what"),
    [
        (
            "postgresql+asyncpg://u:p@db/jobs",
            "unsupported scheme 'postgresql+asyncpg' (Receipt runs on PostgreSQL)",
        ),
        ("oracle://u:p@db/jobs", "unsupported scheme 'oracle' (Receipt runs on PostgreSQL)"),
        ("not a url at all", "not a database URL (Could not parse SQLAlchemy URL from given URL string)"),
    ],
)
def test_a_database_url_receipt_cannot_use_is_refused_before_any_connection(
    tmp_path: Path, url: str, what: str
) -> None:
    found = preflight.database_problem(settings(tmp_path, DATABASE_URL=url))
    assert found is not None and found.what == what


@pytest.mark.parametrize(
    ("url", "line"),
    [
        (
            "amqp://guest:guest@rabbit//",
            "REDIS_URL=amqp://guest:***@rabbit//: unsupported scheme 'amqp' (Receipt's broker is Redis); "
            "set it to redis://[:PASSWORD@]HOST:PORT/DB (rediss:// for TLS), or unset it for the embedded "
            "folder broker",
        ),
        (
            "redis://:s3cret@cache:six/0",
            "REDIS_URL=redis://:***@cache:six/0: not a Redis URL (Port could not be cast to integer value as "
            "'six'); write it as redis://[:PASSWORD@]HOST:PORT/DB",
        ),
    ],
)
def test_a_broker_url_receipt_cannot_use_is_refused_before_any_connection(
    tmp_path: Path, url: str, line: str
) -> None:
    found = preflight.broker_problem(settings(tmp_path, REDIS_URL=url))
    assert found is not None and found.line() == line


def test_the_embedded_folder_broker_needs_a_folder_it_can_create(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("in the way")
    found = preflight.broker_problem(Settings.from_env({"RECEIPT_HOME": str(blocker)}))
    assert found is not None
    assert found.line() == (
        f"REDIS_URL unset, so the embedded folder broker {blocker / 'broker'}: cannot create or write the "
        f"folder ({blocker} is not a folder); make RECEIPT_HOME a writable folder, or set REDIS_URL"
    )
    # Checking creates nothing; a fresh home that does not exist yet is fine.
    assert preflight.broker_problem(settings(tmp_path)) is None
    assert not (tmp_path / "home").exists()


def sqlite_settings(tmp_path: Path) -> tuple[Settings, str]:
    url = f"sqlite:///{tmp_path / 'jobs.db'}"
    return settings(tmp_path, DATABASE_URL=url), url


def test_a_database_without_the_schema_says_to_migrate(tmp_path: Path) -> None:
    s, url = sqlite_settings(tmp_path)
    found = preflight.database_problem(s, Schema.HEAD)
    assert found is not None
    assert found.line() == (
        f"DATABASE_URL={url}: the database has no Receipt schema yet; run `receipt migrate` "
        "(the Procfile's release step)"
    )
    assert preflight.database_problem(s, Schema.ANY) is None  # migrate and up need it reachable only


def test_an_older_schema_says_to_migrate_and_the_latest_passes(tmp_path: Path) -> None:
    s, _url = sqlite_settings(tmp_path)
    engine = make_engine(s.sqlalchemy_url)
    try:
        upgrade(engine, "0005")
        found = preflight.database_problem(s)
        assert found is not None
        assert found.what == f"the schema is at migration 0005, this release needs {head()}"
        assert found.fix == "run `receipt migrate` (the Procfile's release step)"
        upgrade(engine)
        assert preflight.database_problem(s) is None
    finally:
        engine.dispose()


def test_a_schema_from_a_newer_release_is_run_on_with_a_warning(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # Migrations are expand-only, so the previous release keeps serving after the new one migrated.
    s, _url = sqlite_settings(tmp_path)
    engine = make_engine(s.sqlalchemy_url)
    try:
        upgrade(engine)
        with engine.begin() as conn:
            conn.execute(text("UPDATE alembic_version SET version_num = '0099_future'"))
    finally:
        engine.dispose()
    with caplog.at_level("WARNING", logger="receipt.preflight"):
        assert preflight.database_problem(s) is None
    assert f"the schema is at migration 0099_future, newer than this release's {head()}" in caplog.text


def test_liveness_thresholds_out_of_order_are_refused_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = settings(tmp_path, RECEIPT_WORKER_SELF_FENCE_MS="6000", RECEIPT_WORKER_DEAD_AFTER_MS="7000")
    # `receipt config` (which checks nothing) still shows the settings to fix.
    assert preflight.problems(s, database=None, broker=False) == []
    found = preflight.settings_problems(s)
    assert [p.setting for p in found] == ["RECEIPT_WORKER_DEAD_AFTER_MS"]
    assert (
        "RECEIPT_WORKER_DEAD_AFTER_MS=7000 must be at least RECEIPT_WORKER_SELF_FENCE_MS=6000 + 2000 ms"
        in (found[0].line())
    )
    with pytest.raises(SystemExit):
        preflight.require(s, database=None, broker=True)  # flower's check, say
    assert "RECEIPT_WORKER_DEAD_AFTER_MS=7000 must be at least" in capsys.readouterr().err
    assert preflight.settings_problems(settings(tmp_path)) == []


def test_require_reports_every_problem_and_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = settings(tmp_path, DATABASE_URL="mysql://u:p@db/x", REDIS_URL="amqp://h//")
    with pytest.raises(SystemExit) as exited:
        preflight.require(s, database=Schema.HEAD, broker=True)
    assert exited.value.code == preflight.EXIT_CODE == 2
    lines = capsys.readouterr().err.splitlines()
    assert [line.split("=", 1)[0] for line in lines] == ["DATABASE_URL", "REDIS_URL"]


# -- waiting at start ----------------------------------------------------------------------------------


def _refused(setting: str = "REDIS_URL") -> preflight.Problem:
    return preflight.Problem(
        setting, f"{setting}=x", "no Redis answers (connection refused)", "start it", True
    )


def test_require_waits_out_transient_problems_with_a_doubling_backoff(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    answers = [[_refused()], [_refused()], [_refused()], []]
    monkeypatch.setattr(preflight, "problems", lambda *a, **k: answers.pop(0))
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    preflight.require(settings(tmp_path), database=None, broker=True, sleep=sleep, clock=lambda: now[0])
    assert slept == [1.0, 2.0, 4.0]
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(":", 1)[0] for line in lines[:3]] == [
        "waiting for REDIS_URL (try 1, next in 1 s, giving up 60 s after start)",
        "waiting for REDIS_URL (try 2, next in 2 s, giving up 60 s after start)",
        "waiting for REDIS_URL (try 3, next in 4 s, giving up 60 s after start)",
    ]
    assert lines[3] == "start-up checks pass after 3 tries; starting"


def test_require_gives_up_at_the_setting_with_todays_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(preflight, "problems", lambda *a, **k: [_refused()])
    now = [0.0]
    slept: list[float] = []

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    s = settings(tmp_path, RECEIPT_STARTUP_WAIT_S="20")
    with pytest.raises(SystemExit) as exited:
        preflight.require(s, database=None, broker=True, sleep=sleep, clock=lambda: now[0])
    assert exited.value.code == 2
    assert slept == [1.0, 2.0, 4.0, 8.0, 5.0]  # doubling, the last one cut at the deadline
    assert sum(slept) == 20
    assert capsys.readouterr().err.splitlines()[-1] == _refused().line()


def test_require_fails_at_once_when_waiting_cannot_help(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    permanent = preflight.Problem("DATABASE_URL", "x", "the host name 'db' does not resolve", "fix it")
    monkeypatch.setattr(preflight, "problems", lambda *a, **k: [_refused(), permanent])
    slept: list[float] = []
    with pytest.raises(SystemExit):
        preflight.require(settings(tmp_path), database=None, broker=True, sleep=slept.append)
    assert slept == []
    monkeypatch.setattr(preflight, "problems", lambda *a, **k: [_refused()])
    with pytest.raises(SystemExit):
        preflight.require(
            settings(tmp_path, RECEIPT_STARTUP_WAIT_S="0"), database=None, broker=True, sleep=slept.append
        )
    assert slept == []


@pytest.mark.parametrize(
    ("error", "transient"),
    [
        (rex.ConnectionError("Error 111 connecting to 127.0.0.1:1. Connection refused."), True),
        (rex.TimeoutError("Timeout connecting to server"), True),
        (rex.BusyLoadingError("Redis is loading the dataset in memory"), True),
        (rex.ConnectionError("Error -2 connecting to nohost:6379. Name or service not known."), False),
        (rex.AuthenticationError("invalid password"), False),
        (rex.ResponseError("DB index is out of range"), False),
    ],
)
def test_which_broker_errors_are_waited_for(error: Exception, transient: bool) -> None:
    assert preflight.broker_error_is_transient(error) is transient


@pytest.mark.parametrize(
    ("message", "transient"),
    [
        ('connection to server at "127.0.0.1", port 1 failed: Connection refused', True),
        ("timeout expired", True),
        ("FATAL:  the database system is starting up", True),
        ('could not translate host name "db" to address: Name or service not known', False),
        ('FATAL:  password authentication failed for user "x"', False),
        ('FATAL:  database "x" does not exist', False),
    ],
)
def test_which_database_errors_are_waited_for(message: str, transient: bool) -> None:
    assert preflight.database_error_is_transient(Exception(message)) is transient


def test_the_startup_wait_setting_is_bounded() -> None:
    assert Settings.from_env({}).startup_wait_s == 60
    for bad in ("-1", "3601", "soon"):
        with pytest.raises(ValueError, match="RECEIPT_STARTUP_WAIT_S"):
            Settings.from_env({"RECEIPT_STARTUP_WAIT_S": bad})
