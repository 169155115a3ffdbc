"""Who took which message: so a delivery whose message died with the process that fetched it is
known lost within seconds, not after the driver timeout.

Celery acks early (``task_acks_late=False``): once a driver or worker process has fetched a
message, the broker no longer holds it. If that process is SIGKILLed before it acts -- before the
driver sends the worker message, or before the worker writes its lease receipt -- the delivery
record stays ``pending`` until its deadline (the driver timeout, 120 s or more), and the redrive
sends nothing beside a pending delivery.

Every consuming process therefore keeps a **liveness key** ``receipt:consumer:<id>`` in the broker's
Redis with a short TTL (``LIVENESS_TTL_MS``), refreshed by a daemon thread, and records in one
pipelined write per message which stage of which delivery it holds, under the delivery's driver
task id (``receipt:fetch:<dispatch key>:driver:<generation>``, the ``task_id`` column of its
record):

======================  ==========================  ===================================
event                   written by                  value
======================  ==========================  ===================================
driver message sent     the sender (redrive, ...)   ``queued``
driver message fetched  the driver                  ``driver <consumer>``
worker message sent     the driver                  ``sent <consumer>``
worker message fetched  the worker                  ``worker <consumer>``
======================  ==========================  ===================================

A ``receipt.execute_batch`` message carries several deliveries: each is recorded under its own key,
all in the one write per message, so a worker killed holding a batch leaves every one of them lost.

Each write follows the one before it in time (a message is recorded as sent before it is
published, so before anyone can fetch it), so the value is the delivery's latest stage. A scan
message (``receipt.dispatch``, whose driver runs in-process) records ``receipt:dispatching:<jobId>``
= its consumer for each job it names, since the delivery it creates does not exist yet; a batch the
scan takes from the coalescing wake list (``delivery/wakes.py``) is recorded the same way, in one
write per batch, before it is claimed.

``verdict`` is the pure rule the redrive applies to a pending delivery of a queued job. It is
**lost** when its latest stage is *held* (``driver``/``worker``) by a consumer whose liveness key is
gone, or when the task holding it raised (``failed``: written only on failure, by
``task_failure``); or, for a base-key delivery with no record at all (created in-process by a scan,
whose worker message was never sent), when the consumer running that scan is gone or its scan
raised, and the delivery is at least ``INLINE_MIN_AGE_MS`` old. It is **held** while a live
consumer holds it: then it is not presumed lost however empty the queues are. A message recorded
as ``queued``/``sent`` may still wait in the broker (or be on its way to a consumer that has not
recorded it yet), and no record at all says nothing: **unknown**, left to the earlier rules
(broker epoch, presumption when every queue is empty, deadline).

A wrong verdict -- a consumer alive but frozen past its liveness TTL -- costs one duplicate
message, which the attempt fence makes inert. Every Redis failure here is swallowed: without
records the redrive falls back to the earlier rules. The embedded folder broker keeps the same
records as files (``delivery/folder_records.py``).

**Unfetched.** A message recorded ``sent`` (a worker message) or ``queued`` (a driver message)
that nobody has fetched may still wait in its queue, or it may be gone: a Redis key deleted or
evicted, a failover or a restart from an older snapshot that lost the last writes, a purge, a
message file no consumer could decode. ``unfetched`` tells them apart by the queue itself: the
record was written at least ``RECEIPT_REDELIVER_UNFETCHED_MS`` ago (its age is the record's time
to live already spent), **and the queue that message went to holds no message at all**, and the
record still says the same when read again after the queue was counted. A delivery that old with
no record at all is judged the same way against both its queues (the driver's and the worker's):
a broker restarted from an older snapshot loses the records written since, with the messages.
A message waiting its turn is never judged lost, however long it waits: a busy group's
hand-backs (a process gave back attempts it has no slot for, their records back to ``sent``)
wait in the queue until a slot frees, and a queue with anything in it is not presumed empty
of them. The price is that a
message lost *behind* a backlog is noticed once that queue drains. The one race left -- a consumer
that fetched the message a moment before the queue was counted and has not written its record
yet -- costs one duplicate message, which the attempt fence makes inert.
"""

from __future__ import annotations

import contextvars
import logging
import os
import socket
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from app.config import Settings
from app.jobs.routing import DISPATCH_TASK, DRIVER_QUEUE, DRIVER_TASK, EXECUTE_BATCH_TASK, EXECUTE_TASK
from app.jobs.timing import DRIVER_TIMEOUT_FLOOR_MS, DRIVER_TIMEOUT_PAD_MS
from app.ops import outages
from app.ops.preflight import BROKER
from app.storage.delivery import driver_task_id
from delivery.folder_records import FolderRecords

log = logging.getLogger("receipt.fetches")

LIVE_PREFIX = "receipt:consumer:"
FETCH_PREFIX = "receipt:fetch:"
DISPATCHING_PREFIX = "receipt:dispatching:"
# A consumer is presumed dead this long after its last refresh; the thread refreshes 3x as often.
LIVENESS_TTL_MS = 3000
LIVENESS_REFRESH_S = LIVENESS_TTL_MS / 3000
# A scan-created delivery with no record is judged by its scan's consumer only once it is this
# old: a live driver takes milliseconds between recording the delivery and sending its message.
INLINE_MIN_AGE_MS = 2000

QUEUED, DRIVER, SENT, WORKER, FAILED = "queued", "driver", "sent", "worker", "failed"
HELD = frozenset({DRIVER, WORKER})


def record_ttl_ms(settings: Settings) -> int:
    """A record lives as long as the longest delivery it can describe (its driver timeout)."""
    longest = max(settings.job_lease_ms, settings.codex_job_lease_ms, settings.factory_control_job_lease_ms)
    return max(longest + DRIVER_TIMEOUT_PAD_MS, DRIVER_TIMEOUT_FLOOR_MS)


# -- the pure rule -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pending:
    """A pending delivery of a queued job, as the redrive reads it."""

    job_id: str
    purpose: str
    observed: str
    generation: int
    task_id: str
    age_ms: float


@dataclass(frozen=True)
class Record:
    stage: str
    consumer: str | None

    @classmethod
    def parse(cls, raw: Any) -> Record | None:
        text = _text(raw)
        if text is None:
            return None
        stage, _, consumer = text.partition(" ")
        return cls(stage, consumer or None)


def _text(raw: Any) -> str | None:
    if raw is None:
        return None
    return raw.decode() if isinstance(raw, bytes) else str(raw)


LOST, HELD_ALIVE, UNKNOWN = "lost", "held", "unknown"


def verdict(p: Pending, record: Record | None, dispatcher: str | None, alive: set[str]) -> str:
    """``lost``: this pending delivery's message died with its fetcher (or its fetcher gave up on
    it); ``held``: a live consumer holds it right now, so it is not lost whatever the queues
    say; ``unknown``: the earlier rules (epoch, presumption, deadline) decide."""
    if record is not None:
        if record.stage == FAILED:
            return LOST
        if record.stage in HELD and record.consumer:
            return HELD_ALIVE if record.consumer in alive else LOST
        return UNKNOWN  # queued / sent: it may still wait in the broker
    scan_gone = dispatcher is not None and (dispatcher == FAILED or dispatcher not in alive)
    if p.purpose == "dispatch" and scan_gone and p.age_ms >= INLINE_MIN_AGE_MS:
        return LOST
    return UNKNOWN


def lost(p: Pending, record: Record | None, dispatcher: str | None, alive: set[str]) -> bool:
    return verdict(p, record, dispatcher, alive) == LOST


def consumers_named(records: Iterable[Record | None], dispatchers: Iterable[str | None]) -> set[str]:
    named = {r.consumer for r in records if r is not None and r.stage in HELD and r.consumer}
    named.update(d for d in dispatchers if d and d != FAILED)
    return named


UNFETCHED = "unfetched"


def unfetched_candidate(p: Pending, record: Record | None, age_ms: float | None, bound_ms: int) -> bool:
    """A message recorded sent (``sent``/``queued``) at least ``bound_ms`` ago and not fetched since,
    or a delivery that old with no record at all (the record was lost with its message: a restart
    from an older snapshot) (pure); whether it is lost then depends on its queues being empty."""
    if record is None:
        return p.age_ms >= bound_ms
    return record.stage in (SENT, QUEUED) and age_ms is not None and age_ms >= bound_ms


def queues_of(record: Record | None, worker_queue: str) -> tuple[str, ...]:
    """The queues the message a record describes may wait in: the driver's for a driver message,
    the worker queue for a worker message, both when the record is gone."""
    if record is None:
        return (DRIVER_QUEUE, worker_queue)
    return (DRIVER_QUEUE,) if record.stage == QUEUED else (worker_queue,)


def unfetched(
    client: Any,
    pending: Sequence[Pending],
    queues: Sequence[str],
    lengths: Callable[[Iterable[str]], dict[str, int] | None],
    *,
    bound_ms: int,
    ttl_ms: int,
) -> list[bool]:
    """For each pending delivery (``queues``: its worker queue), whether its message was sent at
    least ``bound_ms`` ago, nobody fetched it, and its queue holds nothing (module docstring,
    "Unfetched"). Three reads: the records with their ages, the queue lengths, the records again.
    Raises on a broker error."""
    if not pending:
        return []
    first = _records_with_age(client, pending, ttl_ms)
    candidates = [
        i for i, (record, age) in enumerate(first) if unfetched_candidate(pending[i], record, age, bound_ms)
    ]
    result = [False] * len(pending)
    if not candidates:
        return result
    wanted = {q for i in candidates for q in queues_of(first[i][0], queues[i])}
    counted = lengths(sorted(wanted))
    if counted is None:
        return result
    again = _records_with_age(client, [pending[i] for i in candidates], ttl_ms)
    for i, (record, age) in zip(candidates, again, strict=True):
        if record != first[i][0] or not unfetched_candidate(pending[i], record, age, bound_ms):
            continue  # fetched, handed back or sent again meanwhile
        result[i] = all(counted.get(q) == 0 for q in queues_of(record, queues[i]))
    return result


def _records_with_age(
    client: Any, pending: Sequence[Pending], ttl_ms: int
) -> list[tuple[Record | None, float | None]]:
    pipe = client.pipeline(transaction=False)
    for p in pending:
        pipe.get(FETCH_PREFIX + p.task_id)
        pipe.pttl(FETCH_PREFIX + p.task_id)
    raw = pipe.execute()
    out: list[tuple[Record | None, float | None]] = []
    for value, left in zip(raw[0::2], raw[1::2], strict=True):
        record = Record.parse(value)
        remaining = int(left) if left is not None else -2
        out.append((record, float(ttl_ms - remaining) if record is not None and remaining >= 0 else None))
    return out


def verdicts(client: Any, pending: Sequence[Pending]) -> list[str]:
    """Read the records of these deliveries and the liveness of the consumers they name (two
    pipelined round trips); one verdict per delivery. Raises on a Redis error."""
    if not pending:
        return []
    pipe = client.pipeline(transaction=False)
    for p in pending:
        pipe.get(FETCH_PREFIX + p.task_id)
        pipe.get(DISPATCHING_PREFIX + p.job_id)
    raw = pipe.execute()
    records = [Record.parse(r) for r in raw[0::2]]
    scanners = [_text(r) for r in raw[1::2]]
    named = sorted(consumers_named(records, scanners))
    alive: set[str] = set()
    if named:
        pipe = client.pipeline(transaction=False)
        for consumer in named:
            pipe.exists(LIVE_PREFIX + consumer)
        alive = {c for c, n in zip(named, pipe.execute(), strict=True) if int(n)}
    return [verdict(p, r, d, alive) for p, r, d in zip(pending, records, scanners, strict=True)]


# -- the recorder in each consuming process -----------------------------------------------------------


class Recorder:
    """This process's consumer id, its liveness thread, and the one write per message."""

    def __init__(self, settings: Settings) -> None:
        self.url = where(settings)
        self.consumer = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.client = records_client(settings)
        self.record_ttl_ms = record_ttl_ms(settings)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="receipt-liveness", daemon=True)
        self._warned = False

    def start(self) -> None:
        self.refresh()
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def refresh(self) -> None:
        try:
            self.client.set(LIVE_PREFIX + self.consumer, b"1", px=LIVENESS_TTL_MS)
        except Exception as exc:  # broker down: the records cannot be read either
            self._warn("could not refresh this consumer's liveness key: %s", exc)
        else:
            self._warned = False

    def _run(self) -> None:
        while not self._stop.wait(LIVENESS_REFRESH_S):
            self.refresh()

    def write(self, entries: Sequence[tuple[str, str]]) -> None:
        """One pipelined write: the entries (key, value) and this consumer's liveness."""
        if not entries:
            return
        try:
            pipe = self.client.pipeline(transaction=False)
            for key, value in entries:
                pipe.set(key, value, px=self.record_ttl_ms)
            pipe.set(LIVE_PREFIX + self.consumer, b"1", px=LIVENESS_TTL_MS)
            pipe.execute()
        except Exception as exc:  # no record: the redrive falls back to its earlier rules
            self._warn("could not record a fetched message: %s", exc)
        else:
            self._warned = False

    def _warn(self, msg: str, exc: Exception) -> None:
        # The liveness thread writes every second whatever the consumer is doing, so it is this
        # process's steady sign of a lost broker: the watch hears of every failure (the debug
        # records below reach no handler), and the warning comes once per run of failures.
        if outages.is_broker_outage(exc):
            outages.suspect(BROKER)
        if not self._warned:
            log.warning(msg, exc)
            self._warned = True
        else:
            log.debug(msg, exc)


def where(settings: Settings) -> str:
    """Where this deployment's records live: the broker's Redis, or the embedded broker's folder."""
    return settings.redis_url or f"folder:{settings.home_path / 'broker' / 'records'}"


def records_client(settings: Settings) -> Any:
    """A client for the records: redis-py on the broker's Redis, else ``FolderRecords``."""
    if settings.redis_url:
        import redis

        return redis.Redis.from_url(settings.redis_url, socket_timeout=2, socket_connect_timeout=2)
    return FolderRecords(settings.home_path / "broker" / "records")


def fetched_entries(name: str, args: Any, consumer: str) -> list[tuple[str, str]]:
    """The records a consumer writes on fetching a task message (pure)."""
    try:
        if name == DRIVER_TASK:
            _job_id, key, generation = args
            return [(FETCH_PREFIX + driver_task_id(key, int(generation)), f"{DRIVER} {consumer}")]
        if name == EXECUTE_TASK:
            _job_id, _fence, key, generation = args
            return [(FETCH_PREFIX + driver_task_id(key, int(generation)), f"{WORKER} {consumer}")]
        if name == EXECUTE_BATCH_TASK:
            return [(k, f"{WORKER} {consumer}") for k in batch_keys(args)]
        if name == DISPATCH_TASK:
            (job_ids,) = args
            return [(DISPATCHING_PREFIX + str(job_id), consumer) for job_id in job_ids]
    except (TypeError, ValueError):  # a malformed message: the task itself will reject it
        return []
    return []


def batch_keys(args: Any) -> list[str]:
    """The fetch record key of every delivery a ``receipt.execute_batch`` message carries (pure):
    each attempt in it is its own delivery, recorded and judged on its own. Raises
    ``TypeError``/``ValueError`` on a malformed message."""
    (items,) = args
    keys = []
    for item in items:
        _job_id, _fence, key, generation = item
        keys.append(FETCH_PREFIX + driver_task_id(key, int(generation)))
    return keys


def failed_entries(name: str, args: Any) -> list[tuple[str, str]]:
    """The records a consumer writes when a driver, worker or scan task *raised* (pure): it gave up
    on its message, so a delivery it left pending is lost even though the consumer lives on."""
    try:
        if name == DRIVER_TASK:
            _job_id, key, generation = args
            return [(FETCH_PREFIX + driver_task_id(key, int(generation)), FAILED)]
        if name == EXECUTE_TASK:
            _job_id, _fence, key, generation = args
            return [(FETCH_PREFIX + driver_task_id(key, int(generation)), FAILED)]
        if name == EXECUTE_BATCH_TASK:
            return [(k, FAILED) for k in batch_keys(args)]
        if name == DISPATCH_TASK:
            (job_ids,) = args
            return [(DISPATCHING_PREFIX + str(job_id), FAILED) for job_id in job_ids]
    except (TypeError, ValueError):
        return []
    return []


def record_failed(name: str, args: Any) -> None:
    """Record that this process gave up on these deliveries while it lives on (a batch whose lease
    statement failed): the redrive then judges each lost, as it does a task that raised."""
    recorder = _recorder
    if recorder is not None:
        recorder.write(failed_entries(name, args))


def scan_entries(job_ids: Sequence[str], holder: str) -> list[tuple[str, str]]:
    """The records of a scan batch taken from the wake list (its message named no jobs) (pure):
    ``holder`` is the consumer running the scan, or ``failed`` when the scan raised."""
    return [(DISPATCHING_PREFIX + job_id, holder) for job_id in job_ids]


def record_scan(job_ids: Sequence[str], *, failed: bool = False) -> None:
    """Record that this process is scanning these jobs (or gave up on them), before its claim."""
    recorder = _recorder
    if recorder is not None:
        recorder.write(scan_entries(job_ids, FAILED if failed else recorder.consumer))


# Fetch keys whose ``sent`` record a scan batch already wrote (one write for the batch).
_written: contextvars.ContextVar[frozenset[str]] = contextvars.ContextVar(
    "receipt_sent_written", default=frozenset()
)


class Advance:
    """A scan batch's records, written in one write before any of its messages leaves."""

    def __init__(self, recorder: Recorder | None, keys: Sequence[str], scanned: Sequence[str]) -> None:
        self._recorder = recorder
        self._keys = keys
        self._scanned = scanned
        self._held: list[Any] = []
        self._done = False

    def hold(self, items: Sequence[Sequence[Any]]) -> None:
        """These attempts (a ``receipt.execute_batch`` message's items) run in this process with no
        message: recorded as its fetch instead of ``sent``, as if it had fetched their message."""
        self._held.extend(list(item) for item in items)

    def write(self) -> None:
        """The one write (once): the scan's records, ``sent`` for each message, the held fetches."""
        recorder = self._recorder
        if self._done or recorder is None:
            return
        self._done = True
        held = fetched_entries(EXECUTE_BATCH_TASK, [self._held], recorder.consumer) if self._held else []
        kept = {key for key, _ in held}
        sent = [(k, f"{SENT} {recorder.consumer}") for k in self._keys if k not in kept]
        recorder.write(scan_entries(self._scanned, recorder.consumer) + sent + held)


@contextmanager
def sent_in_advance(
    deliveries: Sequence[tuple[str, str, int]], *, scanned: Sequence[str] = ()
) -> Iterator[Advance]:
    """Around a scan batch's publishes, whose messages leave together at the end of the caller's
    publish batch: the caller ``hold``s the attempts it runs itself, then calls ``write`` before
    that batch leaves, so every record still precedes its fetch; the per-publish hook skips these
    messages. ``deliveries``: (job id, dispatch key, generation) of the attempts about to be sent
    or held. ``scanned``: the jobs the batch claimed, recorded in the same write as ``record_scan``
    would (the claim has committed; nothing of theirs has left yet). A block that ends without
    raising and without ``write`` writes then."""
    recorder = _recorder
    keys = [FETCH_PREFIX + driver_task_id(key, generation) for _job, key, generation in deliveries]
    advance = Advance(recorder if deliveries or scanned else None, keys, scanned)
    token = _written.set(frozenset(keys))
    try:
        yield advance
        advance.write()
    finally:
        _written.reset(token)


def published_entries(name: str, task_id: str | None, args: Any, consumer: str) -> list[tuple[str, str]]:
    """The record a process writes just before it publishes a driver or worker message (pure)."""
    try:
        if name == DRIVER_TASK and task_id:
            return [(FETCH_PREFIX + task_id, QUEUED)]
        if name == EXECUTE_TASK:
            _job_id, _fence, key, generation = args
            return [(FETCH_PREFIX + driver_task_id(key, int(generation)), f"{SENT} {consumer}")]
        if name == EXECUTE_BATCH_TASK:
            return [(k, f"{SENT} {consumer}") for k in batch_keys(args)]
    except (TypeError, ValueError):
        return []
    return []


_lock = threading.Lock()
_recorder: Recorder | None = None


def recorder_for(app: Any) -> Recorder | None:
    """This process's recorder, started on first use by a consumer."""
    global _recorder
    settings: Settings | None = getattr(app, "receipt_settings", None)
    if settings is None:
        return None
    at = where(settings)
    current = _recorder
    if current is not None and current.url == at:
        return current
    with _lock:
        if _recorder is None or _recorder.url != at:
            if _recorder is not None:
                _recorder.stop()
            fresh = Recorder(settings)
            fresh.start()
            _recorder = fresh
        return _recorder


# -- Celery signal receivers (connected in tasks/celery_app.py) ----------------------------------------


def on_worker_init(sender: Any = None, **_: Any) -> None:
    """A consumer is alive before it fetches anything, so a publish it makes is recorded too."""
    recorder_for(getattr(sender, "app", None))


def on_task_received(sender: Any = None, request: Any = None, **_: Any) -> None:
    """In the consumer's thread, as soon as a message is received (before it is acked or run)."""
    if request is None:
        return
    recorder = recorder_for(getattr(sender, "app", None))
    if recorder is not None:
        recorder.write(fetched_entries(request.name, request.args, recorder.consumer))


def on_task_failure(sender: Any = None, args: Any = None, **_: Any) -> None:
    """A driver, worker or scan task raised (a storage outage outlasting its retries): its message
    is consumed and its delivery, if still pending, is lost. Written only on failure."""
    recorder = _recorder
    name = getattr(sender, "name", None)
    if recorder is not None and name is not None:
        recorder.write(failed_entries(name, args))


def on_before_task_publish(sender: Any = None, body: Any = None, headers: Any = None, **_: Any) -> None:
    """In a consuming process only: mark a driver or worker message sent before it is published."""
    recorder = _recorder
    if recorder is None or sender not in (DRIVER_TASK, EXECUTE_TASK, EXECUTE_BATCH_TASK):
        return
    args = body[0] if isinstance(body, tuple) and body else None
    task_id = headers.get("id") if isinstance(headers, dict) else None
    written = _written.get()
    entries = published_entries(str(sender), task_id, args, recorder.consumer)
    recorder.write([(k, v) for k, v in entries if k not in written])
