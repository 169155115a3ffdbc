"""Server-Sent Events over a receipt stream: poll, fold, emit — resumable by seq.

A follower polls the stream every ``poll_ms``, folds each new receipt, and emits one event per
receipt with ``id: <seq>``, so a client that reconnects with ``Last-Event-ID`` resumes exactly
after the last event it saw. Job events carry the folded job state *after each receipt* (every
state, none skipped); receipt events carry the raw receipt. A job stream ends once its job is
terminal and every receipt has been sent; any stream ends after ``max_seconds`` (the client
resumes). Nothing here touches the request: a follower runs after the view has returned.

Resuming reads from the resume point, not from seq 1 (issue 8): a job follower starts from the
job's projection when the projection is not past the resume point (the projection *is* the fold
at its seq) — the usual reconnect, where the client saw the latest state. Only a client that is
behind the projection makes the follower fold the stream's head up to its resume point, because
every state after it must be sent. A raw receipt follower never reads before its resume point.

Every poll also asks ``still_allowed`` (the caller's token is neither revoked nor expired), so a
revoked token's open streams end within one poll.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from flask import Response
from sqlalchemy.engine import Connection, Engine

from api.context import read_connection
from api.present import job_json
from app.jobs.reducer import Job, reduce
from app.jobs.vocab import is_job_stream, job_id_of
from app.storage import projection, store

log = logging.getLogger("receipt.api")

EventKind = Literal["job", "receipt"]
# One poll reads at most this many receipts; a longer backlog is drained before sleeping.
BATCH = 500


def _sleep(seconds: float) -> None:
    # Looked up at call time: under gunicorn's gevent worker ``time.sleep`` is patched after import.
    time.sleep(seconds)


@dataclass(frozen=True)
class Timing:
    """How a follower paces itself: poll interval, lifetime, heartbeat interval, and its clock."""

    poll_ms: int
    max_seconds: float
    heartbeat_seconds: float = 15.0
    sleep: Callable[[float], None] = _sleep
    clock: Callable[[], float] = time.monotonic


def format_event(event: str, seq: int, data: Any) -> str:
    """One SSE frame. ``json.dumps`` escapes newlines, so ``data`` is always a single line."""
    return f"id: {seq}\nevent: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def _starting_point(
    conn: Connection, stream: str, after: int, kind: EventKind
) -> tuple[Job | None, int, int]:
    """For a job stream resuming after ``after``: (state to fold on from, its seq, seq to read after)."""
    if after > 0:
        loaded = projection.load(conn, job_id_of(stream))
        if loaded is not None and loaded.job.seq <= after:
            return loaded.job, loaded.job.seq, loaded.job.seq
        if loaded is not None and kind == "receipt":
            # Raw receipts need the state only to see the job end: fold on from the projection
            # and send the receipts between the resume point and it as they are.
            return loaded.job, loaded.job.seq, after
    return None, 0, 0


def follow(
    engine: Engine,
    stream: str,
    after: int,
    kind: EventKind,
    timing: Timing,
    still_allowed: Callable[[Connection], bool] | None = None,
) -> Iterator[str]:
    """Yield SSE frames for ``stream`` after seq ``after`` until terminal, or until time is up."""
    following_a_job = is_job_stream(stream)
    state: Job | None = None
    folded = 0  # the seq ``state`` is at
    seq = after  # the last seq read
    if following_a_job:
        try:
            with read_connection(engine) as conn:
                state, folded, seq = _starting_point(conn, stream, after, kind)
        except Exception:
            log.warning("event stream %s could not start: storage read failed", stream, exc_info=True)
            yield ": storage unavailable, reconnect\n\n"
            return
    start = timing.clock()
    deadline = start + timing.max_seconds
    next_heartbeat = start + timing.heartbeat_seconds
    # Tell the browser how soon to reconnect when the server ends the stream.
    yield f"retry: {max(timing.poll_ms, 1000)}\n\n"
    while True:
        # A connection per poll: an idle follower must not hold a pooled connection for minutes.
        try:
            with read_connection(engine) as conn:
                if still_allowed is not None and not still_allowed(conn):
                    yield ": credentials revoked or expired\n\n"
                    return
                batch = store.read_stream(conn, stream, after=seq, limit=BATCH)
        except Exception:
            # Headers are long sent, so no error response is possible: end the stream and let
            # the client reconnect with Last-Event-ID (it misses nothing).
            log.warning("event stream %s ended: storage read failed", stream, exc_info=True)
            yield ": storage unavailable, reconnect\n\n"
            return
        for receipt in batch:
            if following_a_job and receipt.seq > folded:
                state = reduce(state, receipt.to_receipt())
                folded = receipt.seq
            seq = receipt.seq
            if seq <= after:
                continue  # folded for state, already seen by the client
            if kind == "job":
                if state is not None:
                    yield format_event("job", seq, job_json(state))
            else:
                yield format_event("receipt", seq, receipt.to_json())
        if len(batch) == BATCH:
            continue
        if state is not None and state.terminal:
            return  # a terminal job's stream ends after its last event
        now = timing.clock()
        if now >= deadline:
            return
        if now >= next_heartbeat:
            yield ": heartbeat\n\n"
            next_heartbeat = now + timing.heartbeat_seconds
        timing.sleep(min(timing.poll_ms / 1000, max(deadline - now, 0.0)))


def event_stream_response(frames: Iterator[str]) -> Response:
    """A streaming response that proxies will not buffer or cache."""
    return Response(
        frames,
        mimetype="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
