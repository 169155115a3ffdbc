"""Once per outage: a running process that loses its database or broker says so in one line, and
in one more when it answers again — not once per retry.

While a dependency is down, every retry loop of a process fails and logs: Celery's consumer
reconnecting, beat publishing each tick, the wake listener, the liveness thread, the local ticker,
tasks failing on a dead connection, each with its traceback. A ``Watch`` per process turns that
into two lines:

* a log record carrying a connection error of the database (``db.is_storage_outage``) or of the
  broker's Redis is a *suspicion*; the watch confirms it with the start-up check
  (``app/ops/preflight.py``), so a deadlock or one dropped connection is not called an outage;
* the first confirmed failure logs ``<setting>=<url, password hidden>: lost — <cause>; <fix>``,
  and every further record about that dependency is dropped (``OutageFilter``, on the one log
  handler of ``app/ops/logs.py``);
* a thread probes the lost dependency every ``RETRY_S`` and logs ``... answers again after N s``
  once it does.

The watch is per process (``install``), as logging is. ``/readyz`` reports through it too
(``api/health.py``), so the web process's probe and its log agree.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass

from app.config import Settings
from app.ops import preflight
from app.ops.preflight import BROKER, DATABASE, Problem, Schema

LOGGER = "receipt.outage"
log = logging.getLogger(LOGGER)

RETRY_S = 1.0
# A probe runs inside the logging call of the record that raised the suspicion, so it is short.
PROBE_TIMEOUT_S = 2
# A dependency a probe found healthy this recently is not probed again on account of a record
# (a burst of deadlock retries costs one probe, not one each).
HEALTHY_FOR_S = 1.0

Probe = Callable[[], Problem | None]


@dataclass(frozen=True)
class Outage:
    """A dependency found down: when (monotonic and wall clock) and the check's problem."""

    since: float
    since_wall: float
    problem: Problem


class Watch:
    """The outage state of one process's dependencies (setting name → probe)."""

    def __init__(
        self,
        probes: Mapping[str, Probe],
        *,
        retry_s: float = RETRY_S,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._probes = dict(probes)
        self._retry_s = retry_s
        self._clock = clock
        self._wall = wall
        self._lock = threading.Lock()  # the state below
        # One confirming probe at a time per dependency (others wait for its verdict).
        self._confirming = {dependency: threading.Lock() for dependency in self._probes}
        self._local = threading.local()
        self._down: dict[str, Outage] = {}
        self._healthy_at: dict[str, float] = {}
        self._thread: threading.Thread | None = None
        self._stopped = threading.Event()

    def down(self, dependency: str) -> Outage | None:
        with self._lock:
            return self._down.get(dependency)

    def suspect(self, dependency: str) -> bool:
        """A failure touching ``dependency`` was seen: True when it is down (known, or confirmed now
        by its probe), False when it answers (or is not watched)."""
        if dependency not in self._probes or getattr(self._local, "probing", False):
            return False
        with self._lock:
            if dependency in self._down:
                return True
            if self._recently_healthy(dependency):
                return False
        with self._confirming[dependency]:
            with self._lock:
                if dependency in self._down:
                    return True
                if self._recently_healthy(dependency):
                    return False
            problem = self._probe(dependency)
            self.observe(dependency, problem)
        return problem is not None

    def observe(self, dependency: str, problem: Problem | None) -> None:
        """A check's result: a problem starts an outage (one line), None ends one (one line)."""
        if dependency not in self._probes:
            return
        now = self._clock()
        with self._lock:
            current = self._down.get(dependency)
            if problem is None:
                self._healthy_at[dependency] = now
                if current is None:
                    return
                del self._down[dependency]
            else:
                self._healthy_at.pop(dependency, None)
                if current is not None:
                    return
                self._down[dependency] = Outage(now, self._wall(), problem)
                self._start_retrying()
        if problem is None:
            assert current is not None
            log.warning("%s: answers again after %.1f s", current.problem.tried, now - current.since)
        else:
            log.error(
                "%s: lost — %s; %s (retrying every %g s; one more line when it answers)",
                problem.tried,
                problem.what,
                problem.fix,
                self._retry_s,
            )

    def stop(self) -> None:
        self._stopped.set()
        thread = self._thread
        if thread is not None:
            thread.join(timeout=5)

    # -- inside

    def _recently_healthy(self, dependency: str) -> bool:
        at = self._healthy_at.get(dependency)
        return at is not None and self._clock() - at < HEALTHY_FOR_S

    def _probe(self, dependency: str) -> Problem | None:
        # A probe's own log records (a driver warning) must not come back here as suspicions.
        self._local.probing = True
        try:
            return self._probes[dependency]()
        except Exception as exc:  # a probe that breaks says so as its problem; it never raises
            return Problem(dependency, dependency, f"the check itself failed ({exc})", "see the log")
        finally:
            self._local.probing = False

    def _start_retrying(self) -> None:
        # Called with the lock held: a thread ending because nothing is down decides under it too.
        if self._thread is None and not self._stopped.is_set():
            self._thread = threading.Thread(target=self._retry, name="receipt-outage-watch", daemon=True)
            self._thread.start()

    def _retry(self) -> None:
        while not self._stopped.wait(self._retry_s):
            with self._lock:
                down = list(self._down)
                if not down:
                    self._thread = None
                    return
            for dependency in down:
                self.observe(dependency, self._probe(dependency))
        with self._lock:
            self._thread = None


def probes_for(settings: Settings, *, database: bool = True, broker: bool = True) -> dict[str, Probe]:
    """The start-up checks as "is it answering?" probes (no schema check: it was checked at start)."""
    probes: dict[str, Probe] = {}
    if database:
        probes[DATABASE] = lambda: preflight.database_problem(settings, Schema.ANY, PROBE_TIMEOUT_S)
    if broker:
        probes[BROKER] = lambda: preflight.broker_problem(settings, PROBE_TIMEOUT_S)
    return probes


# -- the process's watch, and the log filter ----------------------------------------------------------

_current: Watch | None = None


def install(settings: Settings, *, database: bool = True, broker: bool = True) -> Watch:
    """This process's watch (an entry point calls it once its start-up checks passed)."""
    return use(Watch(probes_for(settings, database=database, broker=broker)))


def use(watch: Watch) -> Watch:
    """Make ``watch`` this process's (replacing and stopping any earlier one)."""
    global _current
    if _current is not None:
        _current.stop()
    _current = watch
    return watch


def uninstall() -> None:
    global _current
    if _current is not None:
        _current.stop()
    _current = None


def current() -> Watch | None:
    return _current


def observe(dependency: str, problem: Problem | None) -> None:
    """Report a check's result to this process's watch, if it has one (``/readyz`` does)."""
    watch = _current
    if watch is not None:
        watch.observe(dependency, problem)


def suspect(dependency: str) -> bool:
    """A failure touching ``dependency`` that is not logged at a level the handler sees: the watch
    confirms it as a log record would have (``Watch.suspect``). False without a watch."""
    watch = _current
    return watch.suspect(dependency) if watch is not None else False


def _exceptions(record: logging.LogRecord) -> Iterator[BaseException]:
    if record.exc_info and record.exc_info[1] is not None:
        yield record.exc_info[1]
    args = record.args
    values = args.values() if isinstance(args, Mapping) else (args or ())
    for value in values:
        if isinstance(value, BaseException):
            yield value


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def is_broker_outage(exc: BaseException) -> bool:
    """True when ``exc`` (or one it was raised from) is Redis failing to connect or answer."""
    import redis.exceptions as rex

    for e in _chain(exc):
        if isinstance(e, rex.ConnectionError | rex.TimeoutError):
            return True
        # kombu's wrapper of a transport's connection error (kombu is not imported in app/).
        if type(e).__name__ == "OperationalError" and type(e).__module__.startswith("kombu"):
            return True
    return False


def classify(record: logging.LogRecord) -> str | None:
    """The dependency a record's exception says failed (DATABASE_URL or REDIS_URL), else None."""
    carried = list(_exceptions(record))
    if not carried:
        return None  # most records: nothing to look at
    from app.storage.db import is_storage_outage

    for exc in carried:
        if is_storage_outage(exc):
            return DATABASE
        if is_broker_outage(exc):
            return BROKER
    return None


class OutageFilter(logging.Filter):
    """Drops a record about a dependency this process's watch finds down: one line per outage."""

    def filter(self, record: logging.LogRecord) -> bool:
        watch = _current
        if watch is None or record.name == LOGGER:
            return True
        dependency = classify(record)
        if dependency is None:
            return True
        return not watch.suspect(dependency)
