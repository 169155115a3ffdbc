"""The publish-only delivery client: the Celery messages Receipt sends, and what the broker says back.

Every sender goes through it: the API's wake-up after an enqueue commits (``api/wake.py``), the
dashboard's system page (queue depths and consumers, ``api/ui/system.py``), and the driver, the
execute task and the recovery loops in a worker process (``workers/runtime.py``). A task is sent *by
name* (the names are in ``app/jobs/routing.py``), so a publisher registers no task and imports no
task module: the web process never loads worker code to send one message.

A worker process wraps the Celery app its tasks are registered on (``DeliveryClient.through``):
one connection and producer pool for consuming and publishing. The web process gets an app of its
own configured from the same mapping, ``celeryconfig.build(settings)``, with no task registered
(``DeliveryClient.publish_only``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from app.config import Settings
from app.jobs.reducer import Job
from app.jobs.routing import DISPATCH_TASK, DRIVER_QUEUE, queue_for
from delivery.wakes import QUEUE_TOKEN, WakeList, wake, wake_list_for

OK = "ok"


class DeliveryUnavailable(RuntimeError):
    """The delivery client cannot be built: Celery or the Celery configuration cannot be imported."""


@dataclass(frozen=True)
class QueueDepth:
    """The messages waiting in one queue, or why the broker could not say (``messages`` is None)."""

    messages: int | None
    error: str | None = None


@dataclass(frozen=True)
class Consumers:
    """Who consumes each queue, from the workers that answered a remote-control broadcast."""

    by_queue: dict[str, list[str]]
    answered: int


def consumers_by_queue(active_queues: Mapping[str, Any] | None) -> dict[str, list[str]]:
    """``inspect().active_queues()`` (worker → queue dicts) turned into queue → workers."""
    out: dict[str, list[str]] = {}
    for worker, queues in (active_queues or {}).items():
        for q in queues or []:
            name = q.get("name") if isinstance(q, Mapping) else None
            if isinstance(name, str):
                out.setdefault(name, []).append(str(worker))
    return {k: sorted(v) for k, v in out.items()}


def publish_only_app(settings: Settings, name: str = "receipt-publisher") -> Any:
    """A Celery app with Receipt's configuration and no task registered: it only sends by name."""
    try:
        from celery import Celery

        import celeryconfig
    except ImportError as exc:
        raise DeliveryUnavailable(f"the delivery client cannot be imported: {exc}") from exc
    app = Celery(name, set_as_current=False)
    app.config_from_object(celeryconfig.build(settings))
    return app


class DeliveryClient:
    """Sends Receipt's Celery messages through one Celery app, and reads the broker's queues."""

    def __init__(self, celery: Any, wakes: WakeList | None = None) -> None:
        self.celery = celery
        # The coalescing wake list on the broker's Redis; None on other brokers (and in tests that
        # want every wake-up to carry its ids).
        self.wakes = wakes
        # Where the worker queues of ended jobs go, their places being free: a worker process's own
        # refill (``delivery.listeners.Refill``); None: as wake-ups to the driver (``@<queue>``).
        self.on_freed: Callable[[list[str]], None] | None = None

    @classmethod
    def publish_only(cls, settings: Settings) -> DeliveryClient:
        """A client with an app of its own (the web process): raises ``DeliveryUnavailable``."""
        return cls.through(publish_only_app(settings), settings)

    @classmethod
    def through(cls, celery: Any, settings: Settings) -> DeliveryClient:
        """A client over an app already configured from ``celeryconfig`` (a worker's own app)."""
        return cls(celery, wake_list_for(settings.redis_url, celery.conf.broker_transport_options))

    # -- sending ------------------------------------------------------------------------------------

    def send(
        self,
        task: str,
        args: Sequence[Any],
        *,
        queue: str,
        task_id: str | None = None,
        countdown: float | None = None,
        producer: Any = None,
    ) -> None:
        """Send ``task`` by name onto ``queue``; with a ``producer`` from ``batch``, with that batch."""
        self.celery.send_task(
            task, args=list(args), queue=queue, task_id=task_id, countdown=countdown, producer=producer
        )

    @contextmanager
    def batch(self) -> Iterator[Any]:
        """A producer whose messages leave together, in one pipeline, when the block ends.

        kombu discards what a batch buffered when the block raises: the caller undoes what it
        recorded for those messages.
        """
        with self.celery.producer_or_acquire() as producer, producer.batch():
            yield producer

    def wake(self, jobs: Sequence[Job]) -> None:
        """Wake the dispatch scanner for jobs that became dispatchable, or that ended and so freed a
        place in their worker queue (``delivery/wakes.py``): a queued job's id, or its queue's token
        for an ended one, go onto the wake list and ``receipt.dispatch`` is sent when no scan is
        armed; without a wake list the message carries them. Where ``on_freed`` is set (a worker
        process refilling its own lines), the ended jobs' queues go to it instead."""
        queued = {j.id: queue_for(j.agent_id, j.kind) for j in jobs if not j.terminal}
        freed = list(dict.fromkeys(queue_for(j.agent_id, j.kind) for j in jobs if j.terminal))
        on_freed = self.on_freed
        if on_freed is not None and freed:
            on_freed(freed)
            freed = []
        # A job's id goes to its worker queue's list while a worker listens there; a token to the driver's.
        ids = [*queued, *(QUEUE_TOKEN + q for q in freed)]
        wake(self._send_wake, self.wakes, ids, [*queued.values(), *(None for _ in freed)])

    def wake_queues(self, queues: Sequence[str]) -> None:
        """Wake the dispatch scanner for places freed in ``queues`` (their lines may move)."""
        wake(self._send_wake, self.wakes, [QUEUE_TOKEN + q for q in queues])

    def wake_ids(self, ids: Sequence[str]) -> None:
        """``wake`` for job ids already known dispatchable (wake-ups a stopping driver hands back)."""
        wake(self._send_wake, self.wakes, list(ids))

    def _send_wake(self, ids: list[str]) -> None:
        self.send(DISPATCH_TASK, [ids], queue=DRIVER_QUEUE)

    def check(self) -> str:
        """``ok``, or why a message could not be published (no network I/O: the broker has its own check).

        Loads the broker transport (kombu imports it on first use, e.g. the redis client library)
        and confirms the driver queue is declared.
        """
        try:
            with self.celery.connection_for_write() as conn:
                conn.transport  # noqa: B018 - loading the transport class is the check
            if DRIVER_QUEUE not in self.celery.amqp.queues:
                return f"queue {DRIVER_QUEUE} is not configured"
        except Exception as exc:
            return f"unavailable ({type(exc).__name__}: {exc})"
        return OK

    # -- what the broker says ---------------------------------------------------------------------

    def queue_depths(self, names: Iterable[str]) -> dict[str, QueueDepth]:
        """Each queue's waiting messages, from kombu's own queue declaration (``message_count``):
        a Redis ``LLEN`` over the priority lists on Redis, a file count on the embedded folder broker."""
        names = list(names)
        depths: dict[str, QueueDepth] = {}
        try:
            with self.celery.connection_for_read() as conn:
                channel = conn.default_channel
                for name in names:
                    try:
                        depths[name] = QueueDepth(int(channel.queue_declare(queue=name).message_count))
                    except Exception as exc:
                        depths[name] = QueueDepth(None, type(exc).__name__)
        except Exception as exc:
            unreachable = QueueDepth(None, f"broker unreachable ({type(exc).__name__})")
            return dict.fromkeys(names, unreachable)
        return depths

    def consumers(self, timeout_s: float) -> Consumers:
        """Who consumes which queue: Celery's remote control (``inspect().active_queues()``), a
        broadcast the workers answer within ``timeout_s``. Raises when the broadcast cannot be sent
        (a transport without broadcast, an unreachable broker)."""
        active = self.celery.control.inspect(timeout=timeout_s).active_queues()
        return Consumers(consumers_by_queue(active), len(active or {}))

    def close(self) -> None:
        """Release the app's connection and producer pools."""
        self.celery.close()
