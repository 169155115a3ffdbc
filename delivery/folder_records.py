"""The fetch records and consumer liveness keys of ``delivery/fetches.py`` for the embedded folder
broker, which has no Redis: one small file per key under ``<broker>/records``.

It offers the few Redis commands those records use -- ``set`` with a ``px`` time to live, ``get``,
``exists``, ``pttl`` and a non-transactional ``pipeline`` -- so the recorder and the verdicts read
and write both brokers through one code path. A value is written to a temporary name and renamed
into place (a reader sees a whole value or the previous one); its expiry is stored with it, as
milliseconds of the wall clock, which every process on the one machine shares. Expired files are
removed by ``sweep``, at most once a minute, from the loop that reads them.
"""

from __future__ import annotations

import os
import time
import uuid
from contextlib import suppress
from pathlib import Path
from typing import Any
from urllib.parse import quote

SWEEP_EVERY_S = 60.0


def _now_ms() -> int:
    return int(time.time() * 1000)


class FolderRecords:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._last_sweep = 0.0

    def _path(self, key: str) -> Path:
        return self.folder / quote(key, safe="")

    def _read(self, key: str) -> tuple[int, bytes] | None:
        try:
            raw = self._path(key).read_bytes()
        except OSError:
            return None
        head, _, value = raw.partition(b" ")
        try:
            expires = int(head)
        except ValueError:
            return None
        return (expires, value) if expires > _now_ms() else None

    def set(self, key: str, value: Any, px: int | None = None) -> bool:
        data = value if isinstance(value, bytes) else str(value).encode()
        expires = _now_ms() + (px if px is not None else 10**12)
        path = self._path(key)
        temporary = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            temporary.write_bytes(b"%d %s" % (expires, data))
        except FileNotFoundError:
            self.folder.mkdir(parents=True, exist_ok=True)
            temporary.write_bytes(b"%d %s" % (expires, data))
        os.replace(temporary, path)
        return True

    def get(self, key: str) -> bytes | None:
        found = self._read(key)
        return None if found is None else found[1]

    def exists(self, key: str) -> int:
        return int(self._read(key) is not None)

    def pttl(self, key: str) -> int:
        found = self._read(key)
        return -2 if found is None else max(0, found[0] - _now_ms())

    def pipeline(self, transaction: bool = False) -> _Pipeline:
        return _Pipeline(self)

    def sweep(self) -> int:
        """Remove expired records (at most once a minute); how many went."""
        if time.monotonic() - self._last_sweep < SWEEP_EVERY_S:
            return 0
        self._last_sweep = time.monotonic()
        removed = 0
        now = _now_ms()
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:
            return 0
        for name in names:
            path = self.folder / name
            try:
                head = path.read_bytes().partition(b" ")[0]
                stale = name.endswith(".tmp") or int(head) <= now
            except (OSError, ValueError):
                continue
            if stale:
                with suppress(OSError):
                    path.unlink()
                    removed += 1
        return removed


class _Pipeline:
    def __init__(self, records: FolderRecords) -> None:
        self.records = records
        self.calls: list[tuple[str, tuple[Any, ...], dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        if name not in ("set", "get", "exists", "pttl"):
            raise AttributeError(name)

        def queue(*args: Any, **kwargs: Any) -> _Pipeline:
            self.calls.append((name, args, kwargs))
            return self

        return queue

    def execute(self) -> list[Any]:
        calls, self.calls = self.calls, []
        return [getattr(self.records, name)(*args, **kwargs) for name, args, kwargs in calls]
