"""Bad configuration gets one clear line and exit status 2, from the CLI and from the Procfile's
processes, against the real PostgreSQL and Redis: an unreachable server, an unsupported scheme, a
missing migration, wrong credentials, an unreachable broker. Nothing else is started: each process
stops at its start-up check (app/ops/preflight.py)."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from sqlalchemy.engine import Engine, make_url

from app.config import mask_url
from app.ops.cli import main
from app.ops.preflight import EXIT_CODE
from tests.support.databases import new_database
from tests.support.processes import PYTHON, base_env
from tests.support.waiting import free_port

pytestmark = pytest.mark.postgres

MIGRATE_HINT = "run `receipt migrate` (the Procfile's release step)"
# The one line a process logs: "<date> <time> ERROR   <role> <logger>: <message>".
LOGGED = re.compile(r"^\S+ \S+ ERROR\s+(\S+) (\S+): (.*)$")


@dataclass(frozen=True)
class Case:
    env: dict[str, str]
    line: str


@pytest.fixture
def empty_database_url(pg_admin: Engine) -> Iterator[str]:
    """A PostgreSQL database nobody migrated."""
    with new_database(pg_admin, "receipt_empty") as url:
        yield url


def unreachable_database(port: int) -> Case:
    url = f"postgresql://receipt:s3cret@127.0.0.1:{port}/jobs"
    return Case(
        {"DATABASE_URL": url},
        f"DATABASE_URL=postgresql://receipt:***@127.0.0.1:{port}/jobs: no PostgreSQL answers at "
        f"127.0.0.1:{port} (connection refused); start PostgreSQL there, or set DATABASE_URL to a server "
        "that runs",
    )


UNSUPPORTED_SCHEME = Case(
    {"DATABASE_URL": "mysql://receipt:s3cret@127.0.0.1:3306/jobs"},
    "DATABASE_URL=mysql://receipt:***@127.0.0.1:3306/jobs: unsupported scheme 'mysql' (Receipt runs on "
    "PostgreSQL); set it to postgresql://USER:PASSWORD@HOST:PORT/DATABASE, or unset it for the embedded "
    "SQLite file",
)


def missing_migration(url: str) -> Case:
    return Case(
        {"DATABASE_URL": url},
        f"DATABASE_URL={mask_url(url)}: the database has no Receipt schema yet; {MIGRATE_HINT}",
    )


def wrong_credentials(url: str) -> Case:
    parsed = make_url(url).set(username="nobody", password="s3cret")
    wrong = parsed.render_as_string(hide_password=False)
    return Case(
        {"DATABASE_URL": wrong},
        f"DATABASE_URL={parsed.render_as_string(hide_password=True)}: PostgreSQL at "
        f'{parsed.host}:{parsed.port} refused the login (role "nobody" does not exist); check the user and '
        "password in DATABASE_URL (the password is hidden here)",
    )


def unreachable_broker(database_url: str, port: int) -> Case:
    return Case(
        {"DATABASE_URL": database_url, "REDIS_URL": f"redis://:s3cret@127.0.0.1:{port}/0"},
        f"REDIS_URL=redis://:***@127.0.0.1:{port}/0: no Redis answers at 127.0.0.1:{port} (connection "
        "refused); start redis-server there, or set REDIS_URL to a server that runs",
    )


CASES = (
    "unreachable database",
    "unsupported scheme",
    "missing migration",
    "wrong credentials",
    "unreachable broker",
)


@pytest.fixture
def case_for(request: pytest.FixtureRequest, pg_database_url: str, redis_url: str) -> Callable[[str], Case]:
    """The configuration of a named case (the empty database is made only for the case that needs it)."""
    del redis_url  # a real Redis answers for every case but the broker's own

    def make(name: str) -> Case:
        if name == "unreachable database":
            return unreachable_database(free_port())
        if name == "unsupported scheme":
            return UNSUPPORTED_SCHEME
        if name == "missing migration":
            return missing_migration(str(request.getfixturevalue("empty_database_url")))
        if name == "wrong credentials":
            return wrong_credentials(pg_database_url)
        return unreachable_broker(pg_database_url, free_port())

    return make


# -- the CLI -------------------------------------------------------------------------------------------

# Each case through the verbs it stops: `migrate` and `up` need the database reachable (they bring
# the schema up themselves), `up` the broker answering too; every other database verb needs the schema.
CLI_VERBS = {
    "unreachable database": (["migrate"], ["up"], ["token", "list"]),
    "unsupported scheme": (["migrate"], ["up"], ["verify"]),
    "missing migration": (["token", "list"], ["verify"], ["rebuild-projections"]),
    "wrong credentials": (["migrate"], ["up"], ["callbacks"]),
    "unreachable broker": (["up"],),
}


@pytest.mark.parametrize("name", CASES)
def test_the_cli_says_one_line_and_exits_2(
    name: str,
    case_for: Callable[[str], Case],
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    case = case_for(name)
    monkeypatch.setenv("RECEIPT_HOME", str(tmp_path / "home"))
    for variable, value in case.env.items():
        monkeypatch.setenv(variable, value)
    for verb in CLI_VERBS[name]:
        assert main(verb) == EXIT_CODE == 2, verb
        captured = capsys.readouterr()
        assert (captured.out, captured.err) == ("", case.line + "\n"), verb
        assert "s3cret" not in captured.err


def test_migrate_checks_only_the_database(
    empty_database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    """A release phase migrates with REDIS_URL naming a port where nothing answers."""
    monkeypatch.setenv("RECEIPT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DATABASE_URL", empty_database_url)
    monkeypatch.setenv("REDIS_URL", f"redis://127.0.0.1:{free_port()}/0")
    assert main(["migrate"]) == 0
    assert "REDIS_URL" not in capsys.readouterr().err
    monkeypatch.delenv("REDIS_URL")
    assert main(["token", "list"]) == 0  # the schema is there


def test_migrate_fixes_what_it_said(
    empty_database_url: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    monkeypatch.setenv("RECEIPT_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("DATABASE_URL", empty_database_url)
    assert main(["token", "list"]) == 2
    assert "no Receipt schema" in capsys.readouterr().err
    assert main(["migrate"]) == 0
    capsys.readouterr()
    assert main(["token", "list"]) == 0
    assert capsys.readouterr().out.split() == [
        "id",
        "organizationId",
        "system",
        "scopes",
        "createdAt",
        "expiresAt",
        "revokedAt",
    ]  # no tokens yet: the header alone


# -- the Procfile's processes ----------------------------------------------------------------------------


def run(argv: list[str], env: dict[str, str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    # The line itself is the subject here: no start-up wait (the waits have their tests below).
    env = {"RECEIPT_STARTUP_WAIT_S": "0", **env}
    full = base_env(RECEIPT_HOME=str(tmp_path / "home"), FLOWER_BASIC_AUTH="ops:pw", **env)
    return subprocess.run(argv, env=full, capture_output=True, text=True, timeout=120, check=False)


def the_one_error(done: subprocess.CompletedProcess[str]) -> tuple[str, str, str]:
    output = done.stdout + done.stderr
    assert "Traceback" not in output, output
    errors = [m.groups() for m in map(LOGGED.match, output.splitlines()) if m]
    assert len(errors) == 1, output
    role, logger, message = errors[0]
    return role, logger, message


@pytest.mark.parametrize("name", CASES)
def test_a_worker_says_one_line_and_exits_2(
    name: str, case_for: Callable[[str], Case], tmp_path: Path
) -> None:
    case = case_for(name)
    done = run([PYTHON, "-m", "tasks.worker", "--role", "driver"], case.env, tmp_path)
    assert done.returncode == 2
    assert the_one_error(done) == ("driver", "receipt.worker", case.line)


PROCESSES = {
    # Procfile name: argv, the case it is shown, (role, logger) of its line. The worker roles
    # (driver, chat, codex, control) share tasks.worker, shown above with every case.
    "web": (
        [PYTHON, "-m", "gunicorn", "-c", "python:api.gunicorn_conf", "--bind", "127.0.0.1:0", "api.wsgi:app"],
        "missing migration",
        ("web", "receipt.preflight"),
    ),
    "beat": ([PYTHON, "-m", "tasks.beat"], "unreachable broker", ("beat", "receipt.beat")),
}


@pytest.mark.parametrize("process", sorted(PROCESSES))
def test_every_procfile_process_checks_at_start(
    process: str, case_for: Callable[[str], Case], tmp_path: Path
) -> None:
    argv, name, who = PROCESSES[process]
    case = case_for(name)
    done = run(argv, case.env, tmp_path)
    assert done.returncode == 2
    assert the_one_error(done) == (*who, case.line)


def test_flower_checks_the_broker_only(tmp_path: Path) -> None:
    port = free_port()
    done = run([PYTHON, "-m", "tasks.flower"], {"REDIS_URL": f"redis://127.0.0.1:{port}/0"}, tmp_path)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()  # one line, in Receipt's log format
    assert " ERROR " in line and " receipt.flower: " in line
    assert line.endswith(
        f"REDIS_URL=redis://127.0.0.1:{port}/0: no Redis answers at 127.0.0.1:{port} "
        "(connection refused); start redis-server there, or set REDIS_URL to a server that runs"
    )


# -- waiting at start for a server that is not up yet -------------------------------------------------


WAITING = re.compile(r"^\S+ \S+ WARNING\s+(\S+) (\S+): waiting for (\S+) \(try (\d+), next in (\d+) s")


def test_a_process_waits_for_an_unreachable_broker_then_exits_2_with_todays_line(tmp_path: Path) -> None:
    """RECEIPT_STARTUP_WAIT_S=3: tries after 1 s and 2 s (doubling), one line a try, then the line
    it printed at once before, and status 2. (Flower: it checks the broker alone; a worker that
    waits and then starts is tests/e2e/test_faults.py.)"""
    port = free_port()
    env = {"REDIS_URL": f"redis://127.0.0.1:{port}/0", "RECEIPT_STARTUP_WAIT_S": "3"}
    done = run([PYTHON, "-m", "tasks.flower"], env, tmp_path)
    assert done.returncode == 2
    output = done.stdout + done.stderr
    waits = [m.groups() for m in map(WAITING.match, output.splitlines()) if m]
    assert [(w[2], w[3], w[4]) for w in waits] == [("REDIS_URL", "1", "1"), ("REDIS_URL", "2", "2")], output
    assert the_one_error(done)[2].endswith(
        f"no Redis answers at 127.0.0.1:{port} (connection refused); "
        "start redis-server there, or set REDIS_URL to a server that runs"
    )


def test_a_process_does_not_wait_for_a_host_that_does_not_resolve(tmp_path: Path) -> None:
    env = {"REDIS_URL": "redis://no-such-host.invalid:6379/0", "RECEIPT_STARTUP_WAIT_S": "60"}
    done = run([PYTHON, "-m", "tasks.flower"], env, tmp_path)
    assert done.returncode == 2
    assert not [m for m in map(WAITING.match, (done.stdout + done.stderr).splitlines()) if m]
    assert "does not resolve" in the_one_error(done)[2]
