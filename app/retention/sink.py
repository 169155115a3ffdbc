"""Where archived streams go: a small interface, and the directory it is by default.

A segment is written whole or not at all: the directory sink writes a temporary name, fsyncs it,
renames it into place and fsyncs the folder, so a crash leaves either the whole segment or none
(a temporary left by a crash is never read; the pass's sweep clears it). An object store implements
the same six methods (a PUT of the whole object is atomic there already).

A segment is gzip-compressed JSON lines, one receipt a line, in stream order then seq order: each
line is the receipt as ``GET /streams/<stream>`` shows it (``stream``, ``seq``, ``type``, ``body``,
``at``, ``prevHash``, ``hash``), so ``receipt verify --archive`` recomputes every hash from it alone.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from app.storage.files import PRIVATE_FILE_MODE, private_dir

SUFFIX = ".jsonl.gz"
_PARTIAL = ".partial"


@dataclass(frozen=True)
class Written:
    """A segment as stored: its name, how many lines it holds and its size in bytes."""

    name: str
    lines: int
    bytes: int


class ArchiveSink(Protocol):
    """Whole segments in, whole segments out."""

    def write(self, name: str, lines: Iterable[Mapping[str, Any]]) -> Written:
        """Store ``lines`` as the segment ``name`` (replacing a segment of that name whole)."""
        ...

    def read(self, name: str) -> Iterator[dict[str, Any]]:
        """The segment's lines, in order. ``FileNotFoundError`` when there is no such segment."""
        ...

    def names(self) -> list[str]:
        """Every segment, sorted."""
        ...

    def remove(self, name: str) -> None:
        """Forget a segment no tombstone names (what a crashed pass left), and its unfinished write."""
        ...

    def clear_unfinished(self) -> None:
        """Forget every write that never finished (a crash mid-write): called by the sweep only,
        while no segment is being written."""
        ...

    def free_bytes(self) -> int | None:
        """Space left for segments, where it can be known."""
        ...


class DirectorySink:
    """Segments as files ``<name>.jsonl.gz`` in one private folder (``RECEIPT_ARCHIVE_DIR``)."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)

    def _path(self, name: str) -> Path:
        if not name or "/" in name or name.startswith("."):
            raise ValueError(f"not a segment name: {name!r}")
        return self.root / f"{name}{SUFFIX}"

    def write(self, name: str, lines: Iterable[Mapping[str, Any]]) -> Written:
        private_dir(self.root)
        final = self._path(name)
        partial = final.with_name(final.name + _PARTIAL)
        count = 0
        # 0600 from the first byte: a segment holds tenants' payloads and results.
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, PRIVATE_FILE_MODE)
        with os.fdopen(fd, "wb") as raw:
            # mtime=0: the same lines always give the same bytes (a resumed pass rewrites a
            # segment identically).
            with gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as gz:
                for line in lines:
                    gz.write(json.dumps(line, separators=(",", ":"), ensure_ascii=False).encode())
                    gz.write(b"\n")
                    count += 1
            raw.flush()
            os.fsync(raw.fileno())
        os.replace(partial, final)
        self._sync_dir()
        return Written(name, count, final.stat().st_size)

    def _sync_dir(self) -> None:
        fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def read(self, name: str) -> Iterator[dict[str, Any]]:
        with gzip.open(self._path(name), "rt", encoding="utf-8") as fh:
            for line in fh:
                if line.strip():
                    yield json.loads(line)

    def names(self) -> list[str]:
        if not self.root.is_dir():
            return []
        return sorted(p.name[: -len(SUFFIX)] for p in self.root.iterdir() if p.name.endswith(SUFFIX))

    def remove(self, name: str) -> None:
        # Its own temporary only: another segment may be being written beside it (a bulk archive's
        # page while the pass drops a page that moved).
        final = self._path(name)
        final.unlink(missing_ok=True)
        final.with_name(final.name + _PARTIAL).unlink(missing_ok=True)
        if self.root.is_dir():
            self._sync_dir()

    def clear_unfinished(self) -> None:
        if not self.root.is_dir():
            return
        for partial in self.root.glob(f"*{SUFFIX}{_PARTIAL}"):
            partial.unlink(missing_ok=True)
        self._sync_dir()

    def free_bytes(self) -> int | None:
        probe = self.root if self.root.exists() else self.root.parent
        try:
            return shutil.disk_usage(probe).free
        except OSError:
            return None

    def size_bytes(self, name: str) -> int:
        return self._path(name).stat().st_size
