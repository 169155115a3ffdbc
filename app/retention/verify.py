"""Verification across the boundary: archived chains against their tombstones, and the tombstones
against the live database.

- ``verify_archive``: every segment's streams recompute as whole chains (seq 1.., each ``prevHash``
  the previous ``hash``, each ``hash`` the receipt's own), and, given the database, every tombstone
  finds its stream in the segment it names with the receipt count and final hash it records, and no
  tombstone names a segment the archive lacks.
- ``verify_tombstones``: the live database still proves what left it: each tombstone is well
  formed, and its stream has no receipt and no projection row left.
- ``read_stream``: an archived stream's receipts, for ``receipt replay --archive``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection

from app.jobs.vocab import JOB_STREAM_PREFIX
from app.retention.archive import OBJECTIVE_STREAM_PREFIX, chain_problem
from app.retention.sink import ArchiveSink
from app.storage import tombstones
from app.storage.db import jobs, objectives, receipts

_HASH = re.compile(r"^[0-9a-f]{64}$")
# Problems listed in a report before the rest are only counted.
MAX_PROBLEMS = 50


@dataclass
class Report:
    """What a verification saw: counts, and the problems found (empty: it verified)."""

    segments: int = 0
    streams: int = 0
    receipts: int = 0
    tombstones: int = 0
    unreferenced: int = 0
    problems: list[str] = field(default_factory=list)
    more_problems: int = 0

    @property
    def ok(self) -> bool:
        return not self.problems

    def problem(self, text: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)
        else:
            self.more_problems += 1


def _streams_of(lines: Iterator[dict[str, Any]]) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """A segment's lines grouped by stream, in the order written."""
    current: str | None = None
    chain: list[dict[str, Any]] = []
    for line in lines:
        stream = str(line.get("stream"))
        if stream != current:
            if current is not None:
                yield current, chain
            current, chain = stream, []
        chain.append(line)
    if current is not None:
        yield current, chain


def verify_archive(sink: ArchiveSink, conn: Connection | None = None) -> Report:
    """Recompute every archived chain; with ``conn``, hold each against its tombstone.

    Segments and tombstones are both walked in segment order and merged, so the check reads each
    once and holds one segment's tombstones at a time."""
    report = Report()
    groups = tombstones.by_segment(conn) if conn is not None else iter(())
    pending = next(groups, None)

    def missing(segment: str, count: int) -> None:
        report.tombstones += count
        report.problem(f"segment {segment} is named by tombstones but is not in the archive")

    for name in sorted(sink.names()):
        while pending is not None and pending[0] < name:
            missing(pending[0], len(pending[1]))
            pending = next(groups, None)
        expected: dict[str, tombstones.Tombstone] = {}
        if pending is not None and pending[0] == name:
            expected = pending[1]
            report.tombstones += len(expected)
            pending = next(groups, None)
        _check_segment(sink, name, expected, conn is not None, report)
    while pending is not None:
        missing(pending[0], len(pending[1]))
        pending = next(groups, None)
    return report


def _check_segment(
    sink: ArchiveSink, name: str, expected: dict[str, tombstones.Tombstone], against: bool, report: Report
) -> None:
    report.segments += 1
    seen: set[str] = set()
    try:
        grouped = list(_streams_of(sink.read(name)))
    except (OSError, ValueError, EOFError) as exc:
        report.problem(f"segment {name}: unreadable ({exc})")
        return
    for stream, chain in grouped:
        if stream in seen:
            report.problem(f"segment {name}: {stream} appears twice")
            continue
        seen.add(stream)
        report.streams += 1
        report.receipts += len(chain)
        problem = chain_problem(stream, chain)
        if problem is not None:
            report.problem(f"segment {name}: {stream}: {problem}")
            continue
        if not against:
            continue
        tomb = expected.get(stream)
        if tomb is None:
            report.unreferenced += 1  # a copy no tombstone names: the database still holds it
            continue
        if tomb.receipt_count != len(chain):
            report.problem(
                f"segment {name}: {stream} holds {len(chain)} receipts, its tombstone counts "
                f"{tomb.receipt_count}"
            )
        elif tomb.final_hash != chain[-1]["hash"]:
            report.problem(f"segment {name}: {stream}: final hash differs from its tombstone's")
    for stream in sorted(set(expected) - seen):
        report.problem(f"segment {name}: {stream} is missing, though its tombstone names this segment")


def verify_tombstones(conn: Connection, *, batch: int = 1000) -> Report:
    """Each tombstone well formed, and nothing of its stream left in the database."""
    report = Report()
    page: list[tombstones.Tombstone] = []

    def check(page: list[tombstones.Tombstone]) -> None:
        streams = [t.stream for t in page]
        live = {r[0] for r in conn.execute(select(receipts.c.stream).where(receipts.c.stream.in_(streams)))}
        job_keys = [t.key for t in page if t.kind == "job"]
        objective_keys = [t.key for t in page if t.kind == "objective"]
        rows = set()
        if job_keys:
            rows |= {("job", r[0]) for r in conn.execute(select(jobs.c.id).where(jobs.c.id.in_(job_keys)))}
        if objective_keys:
            rows |= {
                ("objective", r[0])
                for r in conn.execute(select(objectives.c.id).where(objectives.c.id.in_(objective_keys)))
            }
        for t in page:
            prefix = OBJECTIVE_STREAM_PREFIX if t.kind == "objective" else JOB_STREAM_PREFIX
            if t.kind not in ("job", "objective") or t.stream != prefix + t.key:
                report.problem(f"tombstone {t.stream}: kind {t.kind!r} and key {t.key!r} do not name it")
            if t.receipt_count < 1 or not _HASH.match(t.final_hash):
                report.problem(f"tombstone {t.stream}: malformed count or final hash")
            if t.stream in live:
                report.problem(f"tombstone {t.stream}: receipts of the stream are still in the database")
            if (t.kind, t.key) in rows:
                report.problem(f"tombstone {t.stream}: its projection row is still in the database")

    for t in tombstones.iter_all(conn, batch=batch):
        report.tombstones += 1
        report.receipts += t.receipt_count
        page.append(t)
        if len(page) >= batch:
            check(page)
            page = []
    if page:
        check(page)
    return report


def read_stream(sink: ArchiveSink, stream: str, conn: Connection | None = None) -> list[dict[str, Any]]:
    """An archived stream's receipts: from the segment its tombstone names (given the database),
    else from the first segment holding it. ``KeyError`` when the archive holds no such stream."""
    names = sink.names()
    if conn is not None:
        tomb = tombstones.find(conn, stream)
        if tomb is not None:
            names = [tomb.segment]
    for name in names:
        chain = [line for line in sink.read(name) if line.get("stream") == stream]
        if chain:
            return chain
    raise KeyError(stream)
