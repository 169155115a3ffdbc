"""Server-Sent Events over a receipt stream: poll, fold, emit — resumable by seq.

A follower polls the stream every ``poll_ms``, folds each new receipt, and emits one event per
receipt with ``id: <seq>``, so a client that reconnects with ``Last-Event-ID`` resumes exactly
after the last event it saw. Job events carry the folded job state *after each receipt* (every
state, none skipped); receipt events carry the raw receipt. A job stream ends once its job is
terminal and every receipt has been sent; any stream ends after ``max_seconds`` (the client
resumes). Nothing here touches the request: a follower runs after the view has returned.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

from flask import Response
from sqlalchemy.engine import Engine

from api.context import read_connection
from api.present import job_json
from app.jobs.reducer import Job, reduce
from app.jobs.vocab import is_job_stream
from app.storage import store

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


def follow(engine: Engine, stream: str, after: int, kind: EventKind, timing: Timing) -> Iterator[str]:
    """Yield SSE frames for ``stream`` after seq ``after`` until terminal, or until time is up."""
    following_a_job = is_job_stream(stream)
    state: Job | None = None
    seq = 0
    start = timing.clock()
    deadline = start + timing.max_seconds
    next_heartbeat = start + timing.heartbeat_seconds
    # Tell the browser how soon to reconnect when the server ends the stream.
    yield f"retry: {max(timing.poll_ms, 1000)}\n\n"
    while True:
        # A connection per poll: an idle follower must not hold a pooled connection for minutes.
        try:
            with read_connection(engine) as conn:
                batch = store.read_stream(conn, stream, after=seq, limit=BATCH)
        except Exception:
            # Headers are long sent, so no error response is possible: end the stream and let
            # the client reconnect with Last-Event-ID (it misses nothing).
            log.warning("event stream %s ended: storage read failed", stream, exc_info=True)
            yield ": storage unavailable, reconnect\n\n"
            return
        for receipt in batch:
            if following_a_job:
                state = reduce(state, receipt.to_receipt())
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
