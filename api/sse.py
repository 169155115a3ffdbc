"""Server-Sent Events over a receipt stream: poll, fold, emit — resumable by seq.

A follower polls the stream every ``poll_ms``, folds each new receipt, and emits one event per
receipt with ``id: <seq>``, so a client that reconnects with ``Last-Event-ID`` resumes exactly
after the last event it saw. Job events carry the folded job state *after each receipt* (every
state, none skipped); receipt events carry the raw receipt. A job stream ends once its job is
terminal and every receipt has been sent; any stream ends after ``max_seconds`` (the client
resumes). Nothing here touches the request: a follower runs after the view has returned.

Resuming reads from the resume point, not from seq 1: a job follower starts from the
job's projection when the projection is not past the resume point (the projection *is* the fold
at its seq) — the usual reconnect, where the client saw the latest state. Only a client that is
behind the projection makes the follower fold the stream's head up to its resume point, because
every state after it must be sent. A raw receipt follower never reads before its resume point.

Followers do not poll on their own: each subscribes its stream to the process's one poller
(``api.watch``), which reads every open stream's head and every follower's token in one query
per tick and wakes only the followers whose stream advanced. A revoked or expired token's
streams end within one tick.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from flask import Response
from sqlalchemy.engine import Connection, Engine

from api.present import job_json
from api.watch import StreamPoller, Subscription
from app.jobs.reducer import Job, reduce
from app.jobs.vocab import is_job_stream, job_id_of
from app.storage import projection, store
from app.storage.db import read_connection

log = logging.getLogger("receipt.api")

EventKind = Literal["job", "receipt"]
# One poll reads at most this many receipts; a longer backlog is drained before sleeping.
BATCH = 500


STORAGE_UNAVAILABLE = ": storage unavailable, reconnect\n\n"
REVOKED = ": credentials revoked or expired\n\n"
HEARTBEAT = ": heartbeat\n\n"


@dataclass(frozen=True)
class Timing:
    """How a follower paces itself: the poll interval (for ``retry:``), lifetime, heartbeat, clock."""

    poll_ms: int
    max_seconds: float
    heartbeat_seconds: float = 15.0
    clock: Callable[[], float] = time.monotonic


def format_event(event: str, seq: int | None, data: Any) -> str:
    """One SSE frame (no ``id:`` when ``seq`` is None: the resume point stays where it was).

    ``json.dumps`` escapes newlines, so ``data`` is always a single line.
    """
    head = "" if seq is None else f"id: {seq}\n"
    return f"{head}event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n"


def ended(sub: Subscription) -> str | None:
    """The frame that ends a follower's stream now (its token was revoked, or the shared poll
    failed), or None while it may go on."""
    if sub.revoked:
        return REVOKED
    if sub.failed:
        return STORAGE_UNAVAILABLE
    return None


@contextmanager
def subscribed(poller: StreamPoller, streams: dict[str, int], token_id: str | None) -> Iterator[Subscription]:
    """A subscription to the shared poller for the life of a follower (closed however it ends)."""
    sub = poller.subscribe(streams, token_id)
    try:
        yield sub
    finally:
        sub.close()


class Pacer:
    """A follower's lifetime and heartbeats, and the wait for its next wake-up."""

    def __init__(self, timing: Timing) -> None:
        self.timing = timing
        start = timing.clock()
        self.deadline = start + timing.max_seconds
        self.next_heartbeat = start + timing.heartbeat_seconds

    def retry_frame(self) -> str:
        # Tell the browser how soon to reconnect when the server ends the stream.
        return f"retry: {max(self.timing.poll_ms, 1000)}\n\n"

    def idle(self, sub: Subscription) -> Iterator[str]:
        """Heartbeat if due, then wait for the poller (or the next heartbeat, or the deadline).

        Yields nothing more once the lifetime is up: check ``expired`` after.
        """
        now = self.timing.clock()
        if now >= self.deadline:
            return
        if now >= self.next_heartbeat:
            yield HEARTBEAT
            self.next_heartbeat = now + self.timing.heartbeat_seconds
        sub.wait(min(self.next_heartbeat, self.deadline) - now)

    @property
    def expired(self) -> bool:
        return self.timing.clock() >= self.deadline


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
    poller: StreamPoller,
    stream: str,
    after: int,
    kind: EventKind,
    timing: Timing,
    token_id: str | None = None,
) -> Iterator[str]:
    """Yield SSE frames for ``stream`` after seq ``after`` until terminal, or until time is up.

    ``token_id`` (the caller's token, if any) is checked by the poller every tick.
    """
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
            yield STORAGE_UNAVAILABLE
            return
    pacer = Pacer(timing)
    yield pacer.retry_frame()
    with subscribed(poller, {stream: seq}, token_id) as sub:
        read = True  # the first pass reads whatever is already past the resume point
        while True:
            if (end := ended(sub)) is not None:
                yield end
                return
            batch = []
            if read or sub.advanced():
                # A connection per read: an idle follower must not hold a pooled connection.
                try:
                    with read_connection(engine) as conn:
                        batch = store.read_stream(conn, stream, after=seq, limit=BATCH)
                except Exception:
                    # Headers are long sent, so no error response is possible: end the stream and
                    # let the client reconnect with Last-Event-ID (it misses nothing).
                    log.warning("event stream %s ended: storage read failed", stream, exc_info=True)
                    yield STORAGE_UNAVAILABLE
                    return
                read = len(batch) == BATCH  # a longer backlog is drained before waiting
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
            sub.read_up_to(stream, seq)
            if read:
                continue
            if state is not None and state.terminal:
                return  # a terminal job's stream ends after its last event
            yield from pacer.idle(sub)
            if pacer.expired:
                return


def event_stream_response(frames: Iterator[str]) -> Response:
    """A streaming response that proxies will not buffer or cache."""
    return Response(
        frames,
        mimetype="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
