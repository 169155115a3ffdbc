"""Start-up checks of the database and the broker: one clear line per problem, never a traceback.

Every entry point runs them before it does anything else — ``receipt up``, ``receipt migrate`` and
the other database verbs, and every Procfile process (web, the worker roles, beat, Flower) — so a
deployment with a wrong ``DATABASE_URL`` or ``REDIS_URL`` stops at once, saying which setting,
what was tried (the password hidden) and what to do, instead of a 40-line traceback or a process
that claims to be up while nothing can be delivered.

What is checked, in order, each failure being one ``Problem``:

* the URL's scheme is one Receipt runs on (PostgreSQL through psycopg2 or SQLite; Redis);
* the server answers (a connect bounded by ``CONNECT_TIMEOUT_S``), and takes the credentials;
* for processes that read and write jobs, the schema is at this code's last migration
  (``receipt migrate`` and ``receipt up`` bring it there themselves, so they skip this).

The same checks answer "is it back?" while a running process waits out an outage
(``app/ops/outages.py``), and describe an outage in ``/readyz``.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import Enum
from urllib.parse import SplitResult, urlsplit

import redis
import redis.exceptions as rex
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.pool import NullPool

from app.config import Settings, mask_url
from app.jobs import liveness
from app.storage.db import make_engine
from app.storage.revisions import head, known

# Exit status of an entry point refused by its checks: the configuration cannot work as it is.
EXIT_CODE = 2
log = logging.getLogger("receipt.preflight")
CONNECT_TIMEOUT_S = 3
DATABASE = "DATABASE_URL"
BROKER = "REDIS_URL"

# (backend, driver) pairs Receipt runs on; the scheme spellings a user may write for them.
SUPPORTED_DATABASES = frozenset({("postgresql", "psycopg2"), ("sqlite", "pysqlite")})
DATABASE_FORMAT = "postgresql://USER:PASSWORD@HOST:PORT/DATABASE"
# kombu's Redis transports (``sentinel://`` is Redis Sentinel in front of the same broker).
SUPPORTED_BROKER_SCHEMES = ("redis", "rediss", "sentinel")
BROKER_FORMAT = "redis://[:PASSWORD@]HOST:PORT/DB"
MIGRATE = "run `receipt migrate` (the Procfile's release step)"


class Schema(Enum):
    """What a caller needs of the schema: the latest migration, or only a reachable database."""

    HEAD = "head"
    ANY = "any"


@dataclass(frozen=True)
class Problem:
    """One reason the configuration cannot work: the setting, what was tried, what failed, the fix."""

    setting: str
    tried: str
    what: str
    fix: str
    # The server may answer in a moment (refused, no answer, restarting): a starting process waits
    # for it (``require``). Anything else -- the URL, the name, the login, the schema -- will not
    # change by waiting.
    transient: bool = False

    def line(self) -> str:
        return f"{self.tried}: {self.what}; {self.fix}"


# -- the database -----------------------------------------------------------------------------------


def database_tried(settings: Settings) -> str:
    if settings.database_url:
        return f"{DATABASE}={mask_url(settings.database_url)}"
    return f"{DATABASE} unset, so the embedded SQLite file {settings.home_path / 'receipt.db'}"


def database_problem(
    settings: Settings, schema: Schema = Schema.HEAD, timeout_s: int = CONNECT_TIMEOUT_S
) -> Problem | None:
    """None when the database answers (and, for ``Schema.HEAD``, is at the last migration).

    ``timeout_s`` bounds the connect (libpq counts whole seconds and treats less than 2 as 2).
    """
    tried = database_tried(settings)

    def problem(what: str, fix: str) -> Problem:
        return Problem(DATABASE, tried, what, fix)

    try:
        url = make_url(settings.sqlalchemy_url)
    except (ArgumentError, ValueError) as exc:
        return problem(f"not a database URL ({exc})", f"write it as {DATABASE_FORMAT}")
    if (url.get_backend_name(), url.get_driver_name()) not in SUPPORTED_DATABASES:
        scheme = (settings.database_url or "").split("://", 1)[0]
        return problem(
            f"unsupported scheme {scheme!r} (Receipt runs on PostgreSQL)",
            f"set it to {DATABASE_FORMAT}, or unset it for the embedded SQLite file",
        )
    try:
        engine = _probe_engine(settings.sqlalchemy_url, timeout_s)
    except OSError as exc:  # the embedded file's folder cannot be made
        return problem(
            f"cannot create the database file ({exc.strerror or exc})", "make RECEIPT_HOME a writable folder"
        )
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
            if schema is Schema.HEAD:
                return _schema_problem(conn, problem)
    except Exception as exc:  # every failure becomes its one line; none is a bug of the caller's
        what, fix = describe_database_error(exc, url.host, url.port, url.database, timeout_s)
        return Problem(DATABASE, tried, what, fix, transient=database_error_is_transient(exc))
    finally:
        engine.dispose()
    return None


def _probe_engine(url: str, timeout_s: int) -> Engine:
    if url.startswith("sqlite"):
        return make_engine(url, poolclass=NullPool)
    # A connection of its own, given up quickly: the process's pool may be busy or not built yet.
    return create_engine(
        url, poolclass=NullPool, hide_parameters=True, connect_args={"connect_timeout": timeout_s}
    )


def _schema_problem(conn: Connection, problem: Callable[[str, str], Problem]) -> Problem | None:
    # Alembic's own version table, read directly: its migration context logs a dozen set-up lines.
    current = None
    if inspect(conn).has_table("alembic_version"):
        current = conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
    needed = head()
    if current == needed:
        return None
    if current is None:
        return problem("the database has no Receipt schema yet", MIGRATE)
    if known(current):
        return problem(f"the schema is at migration {current}, this release needs {needed}", MIGRATE)
    # A newer release migrated it. Every migration is expand-only in the release that ships it
    # (docs/design.md, "Releases are compatible both ways"), so this release runs on it: during a
    # deploy the previous release keeps serving after the new one's release phase migrated.
    log.warning(
        "the schema is at migration %s, newer than this release's %s: "
        "running on it (migrations are expand-only)",
        current,
        needed,
    )
    return None


_SERVER_SAYS = re.compile(r"FATAL:\s+(.*)", re.DOTALL)
_LOGIN_REFUSED = ("password authentication failed", "no password supplied", "pg_hba.conf", "authentication")


_DATABASE_TRANSIENT = (
    "connection refused",
    "server closed the connection",
    "terminating connection",
    "timeout expired",
    "timed out",
    "starting up",
    "shutting down",
    "in recovery mode",
    "too many connections",
)


def database_error_is_transient(exc: BaseException) -> bool:
    """A database that refuses, does not answer or is restarting may answer soon; a name that does
    not resolve, a refused login or a missing database will not."""
    lowered = str(getattr(exc, "orig", None) or exc).lower()
    if "could not translate host name" in lowered or "name or service not known" in lowered:
        return False
    unix_socket_missing = "no such file or directory" in lowered and "socket" in lowered
    return unix_socket_missing or any(s in lowered for s in _DATABASE_TRANSIENT)


def describe_database_error(
    exc: BaseException,
    host: str | None,
    port: int | None,
    database: str | None,
    timeout_s: int = CONNECT_TIMEOUT_S,
) -> tuple[str, str]:
    """(what went wrong, what to do) for an error connecting to (or reading) the database."""
    orig = getattr(exc, "orig", None) or exc
    message = str(orig).strip()
    first = message.splitlines()[0] if message else type(orig).__name__
    at = f"{host or 'localhost'}:{port or 5432}"
    said = _SERVER_SAYS.search(message)
    server = said.group(1).strip().splitlines()[0] if said else first
    lowered = message.lower()
    if "connection refused" in lowered or ("no such file or directory" in lowered and "socket" in lowered):
        return (
            f"no PostgreSQL answers at {at} (connection refused)",
            "start PostgreSQL there, or set DATABASE_URL to a server that runs",
        )
    if "server closed the connection" in lowered or "terminating connection" in lowered:
        return (
            f"PostgreSQL at {at} closed the connection (restarting, or cut off on the way)",
            "check that PostgreSQL runs there and nothing between drops connections",
        )
    if "could not translate host name" in lowered or "name or service not known" in lowered:
        return (f"the host name {host!r} does not resolve", "correct the host in DATABASE_URL")
    if "timeout expired" in lowered or "timed out" in lowered:
        return (
            f"no answer from {at} within {timeout_s} s",
            "check the host, the port and any firewall between",
        )
    if re.search(r'database "[^"]*" does not exist', server):
        return (
            f"PostgreSQL at {at} has no database {database!r}",
            f"create it (CREATE DATABASE {database}) and {MIGRATE}, or correct the name in DATABASE_URL",
        )
    if re.search(r'role "[^"]*" does not exist', server) or any(s in lowered for s in _LOGIN_REFUSED):
        return (
            f"PostgreSQL at {at} refused the login ({server})",
            "check the user and password in DATABASE_URL (the password is hidden here)",
        )
    if "starting up" in lowered or "shutting down" in lowered or "in recovery mode" in lowered:
        return (
            f"PostgreSQL at {at} is not accepting connections ({server})",
            "wait for it to finish, then retry",
        )
    if "unable to open database file" in lowered:
        return ("cannot open the database file", "make RECEIPT_HOME a writable folder")
    return (f"cannot use the database ({server})", "check DATABASE_URL")


# -- the broker -------------------------------------------------------------------------------------


def broker_tried(settings: Settings) -> str:
    if settings.redis_url:
        return f"{BROKER}={mask_url(settings.redis_url)}"
    return f"{BROKER} unset, so the embedded folder broker {settings.home_path / 'broker'}"


def broker_problem(settings: Settings, timeout_s: float = CONNECT_TIMEOUT_S) -> Problem | None:
    """None when the broker answers: Redis replies to PING, or the embedded folder is writable."""
    tried = broker_tried(settings)
    if not settings.redis_url:
        return _folder_problem(settings, tried)
    url = settings.redis_url
    scheme = url.split("://", 1)[0] if "://" in url else ""
    if scheme not in SUPPORTED_BROKER_SCHEMES:
        return Problem(
            BROKER,
            tried,
            f"unsupported scheme {scheme!r} (Receipt's broker is Redis)",
            f"set it to {BROKER_FORMAT} (rediss:// for TLS), or unset it for the embedded folder broker",
        )
    # A Sentinel URL names the sentinels; one answering PING is what a start can check.
    target = "redis://" + url.split("://", 1)[1].split(";", 1)[0] if scheme == "sentinel" else url
    try:
        client = redis.Redis.from_url(target, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)
    except ValueError as exc:
        return Problem(BROKER, tried, f"not a Redis URL ({exc})", f"write it as {BROKER_FORMAT}")
    try:
        client.ping()
    except Exception as exc:
        parts = urlsplit(target)
        what, fix = describe_broker_error(exc, parts.hostname, _port(parts), timeout_s)
        return Problem(BROKER, tried, what, fix, transient=broker_error_is_transient(exc))
    finally:
        client.close()
    return None


def _port(parts: SplitResult) -> int | None:
    try:
        return int(parts.port) if parts.port else None
    except ValueError:
        return None


def _folder_problem(settings: Settings, tried: str) -> Problem | None:
    """The folder broker works where its folder, or the nearest folder that exists above it, is
    writable (the processes create what is missing): checked without creating anything."""
    folder = settings.home_path / "broker"
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.is_dir() and os.access(existing, os.W_OK | os.X_OK):
        return None
    reason = "not a folder" if existing.exists() and not existing.is_dir() else "not writable"
    return Problem(
        BROKER,
        tried,
        f"cannot create or write the folder ({existing} is {reason})",
        "make RECEIPT_HOME a writable folder, or set REDIS_URL",
    )


def broker_error_is_transient(exc: BaseException) -> bool:
    """Redis refusing, not answering, dropping the connection or loading its data set may answer
    soon; a name that does not resolve, a refused login or a missing database number will not."""
    if isinstance(exc, rex.AuthenticationError):
        return False
    if isinstance(exc, rex.TimeoutError | rex.BusyLoadingError):
        return True
    lowered = str(exc).lower()
    if "name or service not known" in lowered or "name resolution" in lowered or "nodename" in lowered:
        return False
    if "noauth" in lowered or "wrongpass" in lowered or "out of range" in lowered:
        return False
    return isinstance(exc, rex.ConnectionError | ConnectionError) or "connection refused" in lowered


def describe_broker_error(
    exc: BaseException, host: str | None, port: int | None, timeout_s: float = CONNECT_TIMEOUT_S
) -> tuple[str, str]:
    """(what went wrong, what to do) for an error reaching the broker's Redis."""
    at = f"{host or 'localhost'}:{port or 6379}"
    message = str(exc).strip()
    if isinstance(exc, rex.AuthenticationError) or "NOAUTH" in message or "WRONGPASS" in message:
        return (
            f"Redis at {at} refused the login ({message.splitlines()[0] if message else 'authentication'})",
            "check the password (and user) in REDIS_URL (the password is hidden here)",
        )
    if isinstance(exc, rex.TimeoutError):
        return (
            f"no answer from {at} within {timeout_s:g} s",
            "check the host, the port and any firewall between",
        )
    lowered = message.lower()
    if "connection refused" in lowered:
        return (
            f"no Redis answers at {at} (connection refused)",
            "start redis-server there, or set REDIS_URL to a server that runs",
        )
    if "name or service not known" in lowered or "temporary failure in name resolution" in lowered:
        return (f"the host name {host!r} does not resolve", "correct the host in REDIS_URL")
    if "db index is out of range" in lowered:
        return (
            f"Redis at {at} has no such database number",
            "use a database number the server has (0-15 unless it is configured otherwise)",
        )
    return (
        f"cannot use Redis at {at} ({message.splitlines()[0] if message else type(exc).__name__})",
        "check REDIS_URL",
    )


# -- running the checks -----------------------------------------------------------------------------


def settings_problems(settings: Settings) -> list[Problem]:
    """Settings that parse but cannot work together: the worker liveness thresholds' ordering."""
    errors = liveness.ordering_errors(
        settings.worker_liveness_interval_ms, settings.worker_self_fence_ms, settings.worker_dead_after_ms
    )
    return [
        Problem(
            liveness.DEAD_AFTER_ENV,
            f"{liveness.INTERVAL_ENV}={settings.worker_liveness_interval_ms}, "
            f"{liveness.SELF_FENCE_ENV}={settings.worker_self_fence_ms}, "
            f"{liveness.DEAD_AFTER_ENV}={settings.worker_dead_after_ms}",
            error,
            "raise it, or unset the three for their defaults (docs/reliability.md, worker liveness)",
        )
        for error in errors
    ]


def problems(settings: Settings, *, database: Schema | None, broker: bool) -> list[Problem]:
    """Every problem of the checks asked for: ``database`` (None: not checked) and ``broker``; and,
    for a process that asks for either (every server process; not ``receipt config``, which shows
    the settings to fix), the settings that cannot work together."""
    found: list[Problem] = settings_problems(settings) if database is not None or broker else []
    if database is not None:
        db = database_problem(settings, database)
        if db is not None:
            found.append(db)
    if broker:
        br = broker_problem(settings)
        if br is not None:
            found.append(br)
    return found


def report(found: Sequence[Problem], *, log: logging.Logger | None = None) -> None:
    """Say each problem in one line: through ``log`` (a process's configured logging) or on stderr."""
    for p in found:
        if log is not None:
            log.error("%s", p.line())
        else:
            print(p.line(), file=sys.stderr, flush=True)


# The waits between start-up tries: the first try again after 1 s, doubling, at most 10 s apart.
STARTUP_RETRY_FIRST_S = 1.0
STARTUP_RETRY_CAP_S = 10.0


def startup_delays() -> Iterator[float]:
    """1, 2, 4, 8, 10, 10, ... seconds."""
    delay = STARTUP_RETRY_FIRST_S
    while True:
        yield delay
        delay = min(STARTUP_RETRY_CAP_S, delay * 2)


def require(
    settings: Settings,
    *,
    database: Schema | None,
    broker: bool,
    log: logging.Logger | None = None,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """An entry point's check: return once every check passes; exit with ``EXIT_CODE`` at once on a
    problem waiting cannot fix, or after ``RECEIPT_STARTUP_WAIT_S`` of transient ones (a server
    that refuses or does not answer yet), trying again with a doubling backoff and one line a try.
    A platform counts an exit as a crash and delays the next start; Celery itself waits for its
    broker at start, so the check in front of it waits too."""
    deadline = clock() + settings.startup_wait_s
    delays = startup_delays()
    tries = 0
    while True:
        found = problems(settings, database=database, broker=broker)
        if not found:
            if tries:
                _say(log, f"start-up checks pass after {tries} {'try' if tries == 1 else 'tries'}; starting")
            return
        left = deadline - clock()
        if not all(p.transient for p in found) or left <= 0:
            report(found, log=log)
            raise SystemExit(EXIT_CODE)
        tries += 1
        delay = min(next(delays), left)
        for p in found:
            _say(
                log,
                f"waiting for {p.setting} (try {tries}, next in {delay:.0f} s, giving up "
                f"{settings.startup_wait_s} s after start): {p.line()}",
            )
        sleep(delay)


def _say(log: logging.Logger | None, line: str) -> None:
    if log is not None:
        log.warning("%s", line)
    else:
        print(line, file=sys.stderr, flush=True)
