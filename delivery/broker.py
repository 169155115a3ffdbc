"""What the delivery path may learn from the broker itself: its epoch and whether a queue is empty.

**Epoch.** A pending delivery's message lives in the broker. When Redis restarts empty or is
flushed, every such message is gone, yet the delivery record still says "pending" and would block
the job until its deadline (the driver timeout, 120 s or more). The epoch names the broker
incarnation: a random token kept under ``EPOCH_KEY``, created by whoever reads it first. A
FLUSHALL/FLUSHDB removes the key and a restart without persistence starts without it, so a new
token appears and every delivery recorded under the old one is known lost. The key is used rather
than ``INFO server``'s ``run_id`` because a restart *with* persistence keeps the messages and the
key alike: there the run id changes but nothing was lost.

**Queue depth.** The redrive may presume a pending delivery lost when neither the driver queue nor
the job's worker queue holds any message (a driver or worker killed after taking it, before acting
on it). A wrong guess only sends a duplicate, which the attempt fence makes harmless.

**Fetch records.** ``client()`` gives delivery/fetches.py the broker's Redis, where consumers record
which message they fetched and keep a liveness key.

The embedded folder broker has no epoch (its folder outlives no restart of anything but itself):
``FolderProbe`` counts a queue's message files, and keeps the fetch records as files
(``delivery/folder_records.py``).
"""

from __future__ import annotations

import logging
import os
import threading
import time
import uuid
from collections.abc import Iterable
from typing import Any, Protocol

from app.config import Settings
from delivery.folder_records import FolderRecords

log = logging.getLogger("receipt.broker")

EPOCH_KEY = "receipt:broker-epoch"
EPOCH_CACHE_S = 0.5  # at most this stale; a stale epoch only ever causes one harmless duplicate


class BrokerProbe(Protocol):
    def epoch(self) -> str | None: ...

    def queues_empty(self, names: Iterable[str]) -> bool | None: ...

    def queue_lengths(self, names: Iterable[str]) -> dict[str, int] | None: ...

    def client(self) -> Any | None: ...


class NullProbe:
    """A broker that tells nothing (the embedded folder broker)."""

    def epoch(self) -> str | None:
        return None

    def queues_empty(self, names: Iterable[str]) -> bool | None:
        return None

    def queue_lengths(self, names: Iterable[str]) -> dict[str, int] | None:
        return None

    def client(self) -> Any | None:
        return None


class FolderProbe:
    """The embedded folder broker: queue lengths from its data folder, records in its folder."""

    def __init__(self, settings: Settings) -> None:
        root = settings.home_path / "broker"
        self._data = root / "data"
        self._records = FolderRecords(root / "records")

    def epoch(self) -> str | None:
        return None

    def queue_lengths(self, names: Iterable[str]) -> dict[str, int] | None:
        wanted = {f"{name}.msg": name for name in names}
        counts = dict.fromkeys(wanted.values(), 0)
        try:
            listing = os.listdir(self._data)
        except OSError as exc:
            log.warning("could not list the broker folder: %s", exc)
            return None
        for file in listing:
            # A message being written (``.msg.tmp``) counts: it is about to be there.
            rest = file.partition(".")[2].removesuffix(".tmp")
            name = wanted.get(rest)
            if name is not None:
                counts[name] += 1
        return counts

    def queues_empty(self, names: Iterable[str]) -> bool | None:
        lengths = self.queue_lengths(names)
        return None if lengths is None else all(n == 0 for n in lengths.values())

    def client(self) -> Any | None:
        return self._records


class RedisProbe:
    """Reads the epoch (creating it if absent) and queue lengths from the Celery broker's Redis."""

    def __init__(self, url: str) -> None:
        import redis

        self._client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        self._lock = threading.Lock()
        self._cached: tuple[float, str] | None = None

    def epoch(self) -> str | None:
        with self._lock:
            if self._cached is not None and time.monotonic() - self._cached[0] < EPOCH_CACHE_S:
                return self._cached[1]
        try:
            pipe = self._client.pipeline()
            pipe.set(EPOCH_KEY, uuid.uuid4().hex, nx=True)
            pipe.get(EPOCH_KEY)
            _created, raw = pipe.execute()
        except Exception as exc:  # broker down: unknown, so nothing is superseded on its account
            log.warning("could not read the broker epoch: %s", exc)
            return None
        value = raw.decode() if isinstance(raw, bytes) else str(raw)
        with self._lock:
            self._cached = (time.monotonic(), value)
        return value

    def queue_lengths(self, names: Iterable[str]) -> dict[str, int] | None:
        wanted = list(dict.fromkeys(names))
        try:
            pipe = self._client.pipeline()
            for name in wanted:
                pipe.llen(name)
            return {name: int(n) for name, n in zip(wanted, pipe.execute(), strict=True)}
        except Exception as exc:
            log.warning("could not read queue lengths: %s", exc)
            return None

    def queues_empty(self, names: Iterable[str]) -> bool | None:
        lengths = self.queue_lengths(names)
        return None if lengths is None else all(n == 0 for n in lengths.values())

    def client(self) -> Any | None:
        """The broker's Redis, for the fetch records (delivery/fetches.py)."""
        return self._client


def probe_for(settings: Settings) -> BrokerProbe:
    return RedisProbe(settings.redis_url) if settings.redis_url else FolderProbe(settings)
