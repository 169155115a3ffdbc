"""Helpers shared by the in-process runtime tests (runner, dispatch, loops, codex, callbacks)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from celery import Celery
from sqlalchemy.engine import Engine

from app.composition import queue_for
from app.config import Settings
from app.jobs.privilege import Enqueuer
from app.jobs.reducer import Job
from app.jobs.routing import EXECUTE_BATCH_TASK, EXECUTE_TASK
from app.jobs.validation import validate_enqueue
from app.jobs.vocab import job_stream
from app.storage import store
from app.storage.db import db_now, parse_iso
from app.storage.queue import Queue
from delivery import fetches
from delivery.client import DeliveryClient
from devharness.credits import offer_slots
from tasks.celery_app import make_celery
from tests.support.waiting import wait_for
from workers.registry import HandlerRegistry
from workers.runtime import Runtime

ORG = "org-test"
WAIT_S = 10.0


def task_payload(kind: str = "factory.task.run", **extra: Any) -> dict[str, Any]:
    return {"kind": kind, "authContext": {"userId": "u1", "organizationId": ORG}, **extra}


# Who the API would have recorded for a token holding the ``commands`` scope.
COMMANDS_ENQUEUER = Enqueuer(token_id="tok_test", scopes=("commands",), system=False)


def enqueue(
    queue: Queue,
    agent: str,
    *,
    kind: str = "factory.task.run",
    max_attempts: int = 2,
    enqueued_by: Enqueuer | None = COMMANDS_ENQUEUER,
    **payload: Any,
) -> Job:
    req = validate_enqueue(agent, {"payload": task_payload(kind, **payload), "maxAttempts": max_attempts})
    return queue.enqueue(req, enqueued_by=enqueued_by).job


def receipts_of(engine: Engine, job_id: str) -> list[store.StoredReceipt]:
    with engine.connect() as conn:
        return store.read_stream(conn, job_stream(job_id))


def types_of(engine: Engine, job_id: str) -> list[str]:
    return [r.type for r in receipts_of(engine, job_id)]


def wait_until(predicate: Callable[[], Any], timeout: float = WAIT_S, what: str = "condition") -> Any:
    """``wait_for`` with the in-process tests' defaults: a short poll and a 10 s bound."""
    return wait_for(predicate, timeout, interval=0.01, what=what)


def wait_lease_past_deadline(engine: Engine, queue: Queue, job_id: str) -> None:
    """Wait (bounded) until the job's lease deadline is behind the database clock."""
    job = queue.get(job_id)
    assert job is not None and job.lease is not None
    deadline = parse_iso(job.lease.expires_at)
    assert deadline is not None

    def passed() -> bool:
        with engine.connect() as conn:
            return db_now(conn) > deadline

    wait_until(passed, what="the lease deadline to pass")


@dataclass
class SentTask:
    name: str
    args: list[Any]
    task_id: str | None
    queue: str | None


@dataclass
class Recorder:
    """Stands in for ``Celery.send_task``: records every message instead of sending it."""

    sent: list[SentTask] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, name: str, args: Any = None, kwargs: Any = None, **options: Any) -> None:
        # As Celery's publish does: the fetch record hook runs first (a no-op unless a test made
        # this process a recording consumer).
        fetches.on_before_task_publish(
            sender=name, body=(list(args or []), kwargs or {}, {}), headers={"id": options.get("task_id")}
        )
        with self.lock:
            self.sent.append(SentTask(name, list(args or []), options.get("task_id"), options.get("queue")))

    def named(self, name: str) -> list[SentTask]:
        with self.lock:
            return [t for t in self.sent if t.name == name]

    def clear(self) -> None:
        with self.lock:
            self.sent.clear()

    def attempt_fences(self) -> list[str]:
        """The fence of every attempt sent to a worker, alone (``receipt.execute``) or in a batch
        (``receipt.execute_batch``), sorted."""
        with self.lock:
            fences = [str(t.args[1]) for t in self.sent if t.name == EXECUTE_TASK]
            fences += [str(item[1]) for t in self.sent if t.name == EXECUTE_BATCH_TASK for item in t.args[0]]
        return sorted(fences)


RECORDING_TARGET = "http://callbacks.invalid/hook"


@dataclass
class RecordingCallbacks:
    """Stands in for ``delivery.callbacks.Callbacks``: records ``dispatched`` (event, job) pairs.

    Terminal events are outbox rows the queue writes with their receipt (to ``RECORDING_TARGET``
    in a recording runtime): ``events(engine, job_id)`` lists both, in order.
    """

    posted: list[tuple[str, Job]] = field(default_factory=list)
    engine: Engine | None = None
    forgotten: list[str | None] = field(default_factory=list)

    def dispatched(self, engine: Engine, job: Job, fence: str) -> str | None:
        self.posted.append(("dispatched", job))
        return f"dispatched:{fence}"

    def forget(self, engine: Engine, evt_id: str | None) -> None:
        self.forgotten.append(evt_id)

    def events(self, job_id: str | None = None) -> list[str]:
        """Dispatched events recorded here, then every terminal event in the outbox."""
        out = [e for e, j in self.posted if job_id is None or j.id == job_id]
        if self.engine is not None:
            from sqlalchemy import select

            from app.storage.db import callback_outbox

            q = select(callback_outbox.c.event).order_by(callback_outbox.c.id)
            if job_id is not None:
                q = q.where(callback_outbox.c.job_id == job_id)
            with self.engine.connect() as conn:
                out += [e for e in conn.execute(q).scalars() if e != "dispatched"]
        return out


def settings_for(redis_url: str | None = None, **env: str) -> Settings:
    values: dict[str, str] = dict(env)
    if redis_url:
        values["REDIS_URL"] = redis_url
    return Settings.from_env(values)


def recording_runtime(
    engine: Engine,
    settings: Settings,
    registry: HandlerRegistry | None = None,
    app: Celery | None = None,
    *,
    offer: bool = True,
) -> tuple[Runtime, Recorder, RecordingCallbacks]:
    """A Runtime on a real Celery app whose ``send_task`` only records (no worker, no broker I/O),
    its worker queues offered 64 slots (``offer``), as a deployment's live workers would offer theirs."""
    if offer:
        offer_slots(engine)
    app = app or make_celery(settings)
    recorder = Recorder()
    app.send_task = recorder
    client = DeliveryClient(app)  # no wake list: every wake-up is a message of ids, recorded
    queue = queue_for(engine, on_dispatchable=client.wake, callback_targets=(RECORDING_TARGET,))
    callbacks = RecordingCallbacks(engine=engine)
    rt = Runtime(
        settings=settings,
        app=app,
        engine=engine,
        queue=queue,
        registry=registry or HandlerRegistry(),
        callbacks=callbacks,  # type: ignore[arg-type]
        delivery=client,
    )
    app.receipt_runtime = rt
    return rt, recorder, callbacks


def isolate_broker(app: Celery) -> Celery:
    """Prefix every broker key of this app with a per-test namespace, before any connection exists.

    The Redis test database is per xdist worker, not per pytest session: another session on the
    same machine (real worker processes of the e2e suite) consumes the same queue names on the same
    database. With a key prefix no other consumer can take this test's messages.
    """
    options = dict(app.conf.broker_transport_options or {})
    options["global_keyprefix"] = f"t-{uuid.uuid4().hex[:12]}:"
    app.conf.broker_transport_options = options
    return app


def registry_of(handlers: Mapping[str, Callable[..., Any]]) -> HandlerRegistry:
    registry = HandlerRegistry()
    for agent, handler in handlers.items():
        registry.register(agent, handler)
    return registry


def count_passes(monkeypatch: Any) -> list[str]:
    """From here on, the queues of the dispatch passes run, in order (``line.run_pass`` wrapped)."""
    from app.dispatch import line

    ran: list[str] = []
    real = line.run_pass

    def counted(conn: Any, queue: str, *args: Any, **kwargs: Any) -> line.PassResult:
        ran.append(queue)
        return real(conn, queue, *args, **kwargs)

    monkeypatch.setattr(line, "run_pass", counted)
    return ran


def with_wake_list(rt: Runtime, redis_url: str) -> Runtime:
    """``rt`` sending through the wake list on ``redis_url``, as a process on a Redis broker: its
    queue's wake-ups go onto the list, not into recorded messages."""
    from delivery.wakes import WakeList

    rt.delivery = DeliveryClient(rt.app, WakeList(redis_url))
    rt.queue = queue_for(rt.engine, on_dispatchable=rt.delivery.wake)
    return rt


def _done(ctx: Any) -> dict[str, bool]:
    return {"ok": True}


def local_worker_runtime(engine: Engine, redis_url: str, **env: str) -> tuple[Runtime, Recorder]:
    """A ``worker-chat`` process's runtime on a Redis broker whose passes may run attempts here: the
    chat queue consumed with 8 slots (its ``factory`` agent returns at once), two places offered
    to the line and no lead."""
    from app.jobs.routing import QUEUES
    from devharness.credits import offer_slots

    settings = settings_for(
        redis_url, RECEIPT_DISPATCH_LEAD="0", RECEIPT_RESONATE_EXECUTE_CONCURRENCY="8", **env
    )
    rt, sent, _ = recording_runtime(engine, settings, registry_of({"factory": _done}), offer=False)
    offer_slots(engine, slots=2)
    rt = with_wake_list(rt, redis_url)
    rt.app.amqp.queues.select([QUEUES["chat"]])  # what `-Q receipt-chat` makes the consumer read
    assert rt.slots.capacity == 8
    return rt, sent
