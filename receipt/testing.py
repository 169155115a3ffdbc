"""Test your handlers and enqueue code in-process: no server, broker or database server.

``InlineRuntime`` is one Receipt deployment folded into the test's process: a queue on a private
SQLite file, built by the same composition root as production (``app.composition.queue_for``, with
every transition hook), the real worker path (``workers.runner.run_attempt``: lease, heartbeat,
settle under the attempt fence, retry backoff, abort) and a clock the test moves by hand. Every
job is the same append-only, hash-chained receipt stream a deployment writes; nothing here
replaces the reducer or the store. Only delivery is left out: instead of Celery, the test says
when queued work runs (``drain``, ``run``, ``start``)::

    from receipt.testing import InlineRuntime

    def send_mail(ctx):
        return {"sent": ctx.payload["to"]}

    def test_send_mail():
        with InlineRuntime({"mailer": send_mail}) as rt:
            rt.enqueue("mailer", {"to": "a@example.com"})
            rt.assert_enqueued("mailer", payload={"to": "a@example.com"})
            [ran] = rt.drain()
            assert ran.status == "completed"
            assert ran.job.result == {"sent": "a@example.com"}

The model is procrastinate's ``procrastinate.testing``, Dramatiq's ``StubBroker`` + ``Worker`` and
``Oban.Testing`` (``assert_enqueued``, ``drain_queue``). docs/testing.md is the guide.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.config import Settings
from app.jobs.ids import KEY_SEPARATOR, qualify
from app.jobs.kinds import KINDS_WITHOUT_AUTH_CONTEXT
from app.jobs.privilege import Enqueuer
from app.jobs.reducer import Command, Job
from app.jobs.times import parse_iso
from app.jobs.validation import validate_enqueue
from app.jobs.vocab import job_stream
from app.ops.shutdown import Shutdown
from app.storage import store
from app.storage.db import CLOCK_OPTION, jobs, make_engine
from app.storage.migrate import upgrade
from app.storage.queue import Queue
from app.storage.store import StoredReceipt
from workers.handler import Handler, HandlerError, JobContext
from workers.registry import HandlerRegistry, default_registry
from workers.runner import run_attempt

__all__ = [
    "Clock",
    "Command",
    "HandlerError",
    "InlineRuntime",
    "Job",
    "JobContext",
    "Ran",
    "Running",
    "StoredReceipt",
]

ORGANIZATION = "test-org"
USER = "test-user"
DEFAULT_KIND = "factory.run"
# Bounds every wait of a started attempt; a handler that outlives it fails the test, never hangs it.
WAIT_S = 30.0
POLL_S = 0.01


class Clock:
    """The database clock of an ``InlineRuntime``: it stands still until the test moves it.

    Receipts' times, delays (``delayMs``, ``runAt``), retry backoff and lease deadlines are all
    decided on it, as a deployment decides them on the database's clock. It never goes backwards,
    as no database clock a lease relies on may.
    """

    def __init__(self, start: datetime | None = None) -> None:
        start = start if start is not None else datetime.now(UTC).replace(microsecond=0)
        if start.tzinfo is None:
            raise ValueError("the clock's start must be timezone-aware (UTC)")
        self._now = start.astimezone(UTC)
        self._lock = threading.Lock()

    def __call__(self) -> datetime:
        return self.now()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def advance(self, *, ms: int = 0, seconds: float = 0.0) -> datetime:
        """Move the clock forward; returns the new time."""
        step = timedelta(milliseconds=ms, seconds=seconds)
        if step < timedelta(0):
            raise ValueError(f"the clock only moves forward; got a step of {step}")
        with self._lock:
            self._now += step
            return self._now

    def set(self, when: datetime) -> None:
        """Move the clock to ``when`` (timezone-aware, not before the current time)."""
        if when.tzinfo is None:
            raise ValueError("set the clock to a timezone-aware time (UTC)")
        with self._lock:
            if when < self._now:
                raise ValueError(f"the clock only moves forward: {when.isoformat()} is before {self._now}")
            self._now = when.astimezone(UTC)


@dataclass(frozen=True)
class Ran:
    """One attempt the runtime ran: its status as the worker reports it (``completed``, ``canceled``,
    a failure status such as ``failed`` or ``execution_timeout``, or why it did not run) and the job
    after it."""

    job_id: str
    attempt: int
    status: str
    job: Job | None
    error: str | None = None


class Running:
    """An attempt running in a background thread (``InlineRuntime.start``), so the test can act on
    the job while its handler runs: send it a command, cancel it, read its progress."""

    def __init__(self, runtime: InlineRuntime, job_id: str) -> None:
        self._runtime = runtime
        self.job_id = job_id
        self._done = threading.Event()
        self._ran: Ran | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"receipt-testing:{job_id}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._ran = self._runtime.run(self.job_id)
        except BaseException as exc:  # handed to the test's thread by wait()
            self._error = exc
        finally:
            self._done.set()

    def wait_for(self, condition: Callable[[Job], bool], timeout: float = WAIT_S) -> Job:
        """Wait until ``condition(job)`` holds (e.g. ``lambda job: job.progress is not None``): a
        handler's checkpoint made visible through its receipts. Fails if the attempt ends first."""
        deadline = time.monotonic() + timeout
        while True:
            job = self._runtime.job(self.job_id)
            if condition(job):
                return job
            if self._done.is_set():
                raise AssertionError(f"{self.job_id} ended ({job.status}) before the condition held")
            if time.monotonic() >= deadline:
                raise AssertionError(f"{self.job_id}: condition not met within {timeout:g} s")
            # Wakes at once when the attempt ends; otherwise looks at the receipts again.
            self._done.wait(POLL_S)

    def wait(self, timeout: float = WAIT_S) -> Ran:
        """The attempt's outcome, once the runner has settled it."""
        if not self._done.wait(timeout):
            raise AssertionError(f"{self.job_id}: the attempt did not end within {timeout:g} s")
        if self._error is not None:
            raise self._error
        assert self._ran is not None
        return self._ran


class InlineRuntime:
    """A private Receipt deployment inside the test process (see the module docstring).

    ``handlers`` maps agent ids to handlers (``Callable[[JobContext], Any]``); ``handler_modules``
    loads modules the way ``RECEIPT_HANDLER_MODULES`` does (each exposes ``register(registry)``).
    The built-in agents (the Factory's and codex's) are registered too, so jobs the Factory's hooks
    enqueue run as well. ``settings`` are the deployment's settings (``Settings()``: the defaults,
    retry backoff included). Jobs are posted as ``organization``; a job id without an organisation
    in it is that organisation's.
    """

    def __init__(
        self,
        handlers: Mapping[str, Handler] | None = None,
        *,
        handler_modules: Iterable[str] = (),
        settings: Settings | None = None,
        clock: Clock | None = None,
        organization: str = ORGANIZATION,
        directory: Path | None = None,
    ) -> None:
        self.settings = settings if settings is not None else Settings()
        self.clock = clock if clock is not None else Clock()
        self.organization = organization
        self._owned_dir = directory is None
        self._dir = Path(tempfile.mkdtemp(prefix="receipt-testing-")) if directory is None else directory
        path = self._dir / "receipt.db"
        shutil.copyfile(_migrated_template(), path)
        self._engine: Engine = make_engine(f"sqlite:///{path}").execution_options(
            **{CLOCK_OPTION: self.clock}
        )
        self.queue: Queue = queue_for(self._engine, max_commands_per_job=self.settings.max_commands_per_job)
        self.registry = HandlerRegistry()
        # This runtime's worker shutdown (``shut_down``), apart from the test process's own.
        self._shutdown = Shutdown()
        self._contexts: dict[str, JobContext] = {}
        self._lock = threading.Lock()
        loaded = default_registry(handler_modules)
        for agent_id in loaded.agent_ids():
            handler = loaded.get(agent_id)
            assert handler is not None
            self.register(agent_id, handler)
        for agent_id, handler in (handlers or {}).items():
            self.register(agent_id, handler)

    # -- set-up
    def register(self, agent_id: str, handler: Handler) -> None:
        """Run ``handler`` for ``agent_id``'s jobs (as a module's ``register(registry)`` would)."""

        def tracked(ctx: JobContext) -> Any:
            # The attempt's context, so ``cancel`` signals it at once, as the runner's abort poll does.
            with self._lock:
                self._contexts[ctx.job.id] = ctx
            # An abort that arrived after the attempt started and before the context was known:
            # ``cancel`` writes before it looks the context up, so one of the two sees the other.
            now = self.queue.get(ctx.job.id)
            if now is not None and now.abort_requested:
                ctx.cancel(now.abort_reason or "abort")
            try:
                return handler(ctx)
            finally:
                with self._lock:
                    self._contexts.pop(ctx.job.id, None)

        self.registry.register(agent_id, tracked)

    def close(self) -> None:
        """Stop the queue's hooks, close the database and remove its folder."""
        self.queue.close()
        self._engine.dispose()
        if self._owned_dir:
            shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> InlineRuntime:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- writing
    def key(self, job_id: str) -> str:
        """The storage key of a job: a client id is this runtime's organisation's."""
        return job_id if KEY_SEPARATOR in job_id else qualify(self.organization, job_id)

    def enqueue(
        self,
        agent_id: str,
        payload: Mapping[str, Any] | None = None,
        *,
        kind: str = DEFAULT_KIND,
        enqueued_by: Enqueuer | None = None,
        **body: Any,
    ) -> Job:
        """Enqueue as ``POST /agents/<agentId>/jobs`` does, validated by the same rules (a bad body
        raises the ``ValidationError`` the API answers 400 with). ``body`` takes the API's field
        names: ``jobId``, ``maxAttempts``, ``delayMs``, ``runAt``, ``sessionKey``, ``singletonMode``,
        ``lane``. ``payload`` gets ``kind`` and this runtime's ``authContext`` unless it has them."""
        full = {"kind": kind, **(payload or {})}
        if "authContext" not in full and full["kind"] not in KINDS_WITHOUT_AUTH_CONTEXT:
            full["authContext"] = {"userId": USER, "organizationId": self.organization}
        req = validate_enqueue(agent_id, {**body, "payload": full})
        return self.queue.enqueue(req, enqueued_by=enqueued_by).job

    def cancel(self, job_id: str, reason: str | None = None) -> Job:
        """Cancel as ``POST /jobs/<id>/cancel`` does: a queued job ends ``canceled``; a running one
        gets its abort request, and its handler's context is cancelled at once (``ctx.cancelled``),
        as the worker's abort poll would; the runner then settles it ``canceled``."""
        key = self.key(job_id)
        job = self.queue.cancel(key, reason).job
        with self._lock:
            ctx = self._contexts.get(key)
        if ctx is not None and job.abort_requested:
            ctx.cancel(job.abort_reason or "abort")
        return job

    def command(
        self,
        job_id: str,
        type_: str,
        payload: Any = None,
        *,
        reason: str | None = None,
        lane: str | None = None,
    ) -> Job:
        """Send a queue command (``steer`` or ``follow_up``), as ``POST /jobs/<id>/commands`` does;
        the handler reads it with ``ctx.commands()``."""
        return self.queue.command(self.key(job_id), type_, payload, reason, lane=lane).job

    # -- running
    def due(self) -> list[Job]:
        """Queued jobs a worker may run now, oldest first: not delayed past the clock (a job with an
        abort request is due at once, so it ends canceled)."""
        now = self.clock.now()
        queued = self.jobs(status="queued")
        return [j for j in queued if j.abort_requested or _available(j, now)]

    def run(self, job_id: str) -> Ran:
        """Run the job's next attempt through the real worker path, in this thread."""
        if self._shutdown.requested:
            raise AssertionError("this runtime's worker is shut down (shut_down): call restart() first")
        key = self.key(job_id)
        job = self.job(key)
        attempt = job.attempt + 1
        out = run_attempt(self.queue, self.settings, self.registry, key, attempt, shutdown=self._shutdown)
        return Ran(key, attempt, out.status, out.job, out.error)

    def shut_down(self, grace_ms: int = 1000) -> None:
        """A SIGTERM to this runtime's worker, as a deploy sends it. Attempts running (``start``) may
        finish for the first three quarters of ``grace_ms``; then each handler's ``ctx.cancelled``
        fires with ``ctx.cancel_reason == "shutdown"``, it gets half the rest to save a checkpoint
        (``ctx.progress``), and its attempt is handed back: ``job.released``, the job queued again,
        not charged to ``maxAttempts`` (``Running.wait`` reports ``released``). ``ctx.shutting_down``
        is true from now on. Nothing runs again until ``restart``."""
        self._shutdown.begin(grace_ms)

    def restart(self) -> None:
        """The new release: jobs run again (``drain``), a handed-back one with the progress its
        stopped attempt saved as ``ctx.checkpoint``."""
        self._shutdown = Shutdown()

    def drain(self, *, max_attempts: int = 1000) -> list[Ran]:
        """Run due jobs until none is due, jobs enqueued meanwhile (by handlers, by the Factory's
        hooks) and retries due at the current clock included; returns every attempt, in order.
        A retry backing off is not due until the clock passes its ``availableAt``."""
        ran: list[Ran] = []
        while True:
            due = self.due()
            if not due:
                return ran
            for job in due:
                if len(ran) >= max_attempts:
                    raise AssertionError(f"drain ran {max_attempts} attempts and jobs are still due")
                ran.append(self.run(job.id))

    def start(self, job_id: str) -> Running:
        """Run the job's next attempt in a background thread; ``Running.wait`` returns its outcome."""
        return Running(self, self.key(job_id))

    def expire_leases(self) -> list[Job]:
        """The lease-expiry pass at the current clock (a deployment runs it every few seconds)."""
        return self.queue.expire_leases()

    # -- reading
    def job(self, job_id: str) -> Job:
        job = self.queue.get(self.key(job_id))
        if job is None:
            raise AssertionError(f"no job {job_id!r} in organisation {self.organization!r}")
        return job

    def jobs(self, agent_id: str | None = None, *, status: str | None = None) -> list[Job]:
        """Jobs of every organisation, oldest first, optionally of one agent and one status."""
        q = select(jobs.c.id).order_by(jobs.c.created_at, jobs.c.id)
        if agent_id is not None:
            q = q.where(jobs.c.agent_id == agent_id)
        if status is not None:
            q = q.where(jobs.c.status == status)
        with self._engine.connect() as conn:
            ids = list(conn.execute(q).scalars())
        # Read each job after the listing's connection is closed: on SQLite every transaction holds
        # the write lock (BEGIN IMMEDIATE), so a second one opened inside it would wait for it.
        return [j for j in (self.queue.get(i) for i in ids) if j is not None]

    def receipts(self, job_id: str) -> list[StoredReceipt]:
        """The job's receipt stream, in order (its hash chain is the store's, checked on write)."""
        with self._engine.connect() as conn:
            return store.read_stream(conn, job_stream(self.key(job_id)))

    def types(self, job_id: str) -> list[str]:
        """The types of the job's receipts, in order (``job.enqueued``, ``job.leased``, ...)."""
        return [r.type for r in self.receipts(job_id)]

    # -- assertions
    def enqueued(
        self,
        agent_id: str | None = None,
        *,
        kind: str | None = None,
        payload: Mapping[str, Any] | None = None,
        status: str | None = "queued",
    ) -> list[Job]:
        """Jobs that match: of ``agent_id``, of payload ``kind``, whose payload holds ``payload``
        (a subset: nested mappings compare as subsets too), in ``status`` (None: any status)."""
        return [
            j
            for j in self.jobs(agent_id, status=status)
            if (kind is None or j.kind == kind) and (payload is None or _holds(j.payload, payload))
        ]

    def assert_enqueued(
        self,
        agent_id: str | None = None,
        *,
        kind: str | None = None,
        payload: Mapping[str, Any] | None = None,
        status: str | None = "queued",
    ) -> Job:
        """The one job that matches (see ``enqueued``); fails, listing what is there, unless
        exactly one does."""
        found = self.enqueued(agent_id, kind=kind, payload=payload, status=status)
        if len(found) != 1:
            there = [(j.agent_id, j.kind, j.status, dict(j.payload)) for j in self.jobs()]
            raise AssertionError(
                f"expected one job (agent={agent_id!r}, kind={kind!r}, payload⊇{payload!r}, "
                f"status={status!r}), found {len(found)}; jobs: {there}"
            )
        return found[0]

    def refute_enqueued(
        self,
        agent_id: str | None = None,
        *,
        kind: str | None = None,
        payload: Mapping[str, Any] | None = None,
        status: str | None = "queued",
    ) -> None:
        """Fail if any job matches (see ``enqueued``)."""
        found = self.enqueued(agent_id, kind=kind, payload=payload, status=status)
        if found:
            raise AssertionError(f"expected no matching job, found {[j.id for j in found]}")


def _available(job: Job, now: datetime) -> bool:
    at = parse_iso(job.available_at)
    return at is None or at <= now


def _holds(actual: Any, expected: Any) -> bool:
    if isinstance(expected, Mapping):
        return isinstance(actual, Mapping) and all(
            k in actual and _holds(actual[k], v) for k, v in expected.items()
        )
    return bool(actual == expected)


_TEMPLATE: list[Path] = []
_TEMPLATE_LOCK = threading.Lock()


def _migrated_template() -> Path:
    """A SQLite file migrated to head, once per process; each runtime starts from a copy of it."""
    with _TEMPLATE_LOCK:
        if not _TEMPLATE:
            folder = Path(tempfile.mkdtemp(prefix="receipt-testing-template-"))
            atexit.register(shutil.rmtree, folder, ignore_errors=True)
            path = folder / "template.db"
            engine = make_engine(f"sqlite:///{path}")
            try:
                upgrade(engine)
            finally:
                engine.dispose()
            _TEMPLATE.append(path)
        return _TEMPLATE[0]
