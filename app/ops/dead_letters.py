"""Broker messages no worker could decode, kept aside where an operator can list them.

A message a consumer cannot decode (an empty or torn file, bytes that are not JSON, an envelope
kombu cannot read, a body Celery cannot parse) must neither stop the worker nor vanish without a
trace: it is logged once, with its queue and a hash of its bytes, and kept here. Nothing is
retried from here: the job it may have carried is recovered from its receipts (the unfetched
redelivery, the queued redrive), so a dead letter is evidence, not work.

- **Embedded folder broker:** the message file itself is moved into ``<broker>/dead`` (a rename in
  the same file system), keeping its name, which says its time and queue.
- **Redis:** a JSON entry (time, queue, hash, reason, size, the first bytes) is pushed onto the list
  ``receipt:dead-letters``, capped at ``REDIS_KEEP`` entries.

``receipt dead-letters`` lists either (``app/ops/cli.py``). This is operator tooling beside the
broker, so it may use the plain Redis client (an ignored import in the core's contract).
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from app.config import Settings

log = logging.getLogger("receipt.dead_letters")

REDIS_KEY = "receipt:dead-letters"
REDIS_KEEP = 1000
# Bytes of an undecodable Redis message kept with its entry: enough to recognise it.
KEPT_BYTES = 4096
FOLDER = "dead"


@dataclass(frozen=True)
class DeadLetter:
    at: float  # seconds since the epoch
    queue: str
    sha256: str
    size: int
    reason: str
    where: str  # the file, or the Redis list

    def as_json(self) -> dict[str, Any]:
        return {
            "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.at)),
            "queue": self.queue,
            "sha256": self.sha256,
            "size": self.size,
            "reason": self.reason,
            "where": self.where,
        }


def digest(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def announce(queue: str, raw: bytes, reason: str, where: str) -> None:
    """The one log line per dead letter."""
    log.error(
        "undecodable message on queue %s (sha256 %s, %d bytes): %s; kept as a dead letter in %s",
        queue,
        digest(raw)[:16],
        len(raw),
        reason,
        where,
    )


class DeadLetters(Protocol):
    def listed(self, limit: int) -> list[DeadLetter]: ...


def folder_queue(name: str) -> str:
    """The queue of a folder-broker message file ``<ms>_<uuid>.<queue>.msg``."""
    rest = name.partition(".")[2]
    return rest[: -len(".msg")] if rest.endswith(".msg") else rest


class FolderDeadLetters:
    """``<broker>/dead``: message files moved aside whole."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def keep(self, path: Path, queue: str, raw: bytes, reason: str) -> None:
        """Move the claimed message file ``path`` here (same file system: a rename)."""
        self.folder.mkdir(parents=True, exist_ok=True)
        target = self.folder / path.name
        try:
            os.replace(path, target)
        except OSError as exc:  # the evidence is lost, the worker is not
            log.warning("could not keep %s as a dead letter: %s", path, exc)
            target = path
        announce(queue, raw, reason, str(target))

    def keep_copy(self, queue: str, raw: bytes, reason: str) -> None:
        """Write a message already taken from its file (one Celery could not parse) as a file here."""
        self.folder.mkdir(parents=True, exist_ok=True)
        target = self.folder / f"{int(time.time() * 1000)}_{digest(raw)[:16]}.{queue}.msg"
        target.write_bytes(raw)
        announce(queue, raw, reason, str(target))

    def listed(self, limit: int) -> list[DeadLetter]:
        try:
            names = sorted(os.listdir(self.folder), reverse=True)
        except FileNotFoundError:
            return []
        found = []
        for name in names[:limit]:
            path = self.folder / name
            try:
                raw = path.read_bytes()
                at = path.stat().st_mtime
            except OSError:
                continue
            found.append(DeadLetter(at, folder_queue(name), digest(raw), len(raw), "undecodable", str(path)))
        return found


class RedisDeadLetters:
    """The capped list ``receipt:dead-letters`` on the broker's Redis."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def keep(self, queue: str, raw: bytes, reason: str) -> None:
        entry = {
            "at": time.time(),
            "queue": queue,
            "sha256": digest(raw),
            "size": len(raw),
            "reason": reason,
            "head": base64.b64encode(raw[:KEPT_BYTES]).decode(),
        }
        where = f"the Redis list {REDIS_KEY}"
        try:
            pipe = self.client.pipeline(transaction=False)
            pipe.lpush(REDIS_KEY, json.dumps(entry))
            pipe.ltrim(REDIS_KEY, 0, REDIS_KEEP - 1)
            pipe.execute()
        except Exception as exc:  # the broker failing now: the evidence is the log line alone
            where = f"nowhere (Redis refused it: {exc})"
        announce(queue, raw, reason, where)

    def listed(self, limit: int) -> list[DeadLetter]:
        found = []
        for raw in self.client.lrange(REDIS_KEY, 0, max(limit, 1) - 1):
            try:
                e = json.loads(raw)
                found.append(
                    DeadLetter(
                        float(e["at"]),
                        str(e["queue"]),
                        str(e["sha256"]),
                        int(e["size"]),
                        str(e["reason"]),
                        REDIS_KEY,
                    )
                )
            except (ValueError, KeyError, TypeError):
                continue
        return found


def folder_for(settings: Settings) -> Path:
    return settings.home_path / "broker" / FOLDER


def store_for(settings: Settings) -> FolderDeadLetters | RedisDeadLetters:
    """The dead letters of the configured broker."""
    if settings.redis_url:
        import redis

        return RedisDeadLetters(
            redis.Redis.from_url(settings.redis_url, socket_timeout=3, socket_connect_timeout=3)
        )
    return FolderDeadLetters(folder_for(settings))
