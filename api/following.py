"""What every event-stream endpoint shares: where a follower resumes, the stream's timing, and the
stream slot it holds (jobs, receipts and objectives alike, in ``api/streams.py``,
``api/objectives.py`` and the dashboard)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from flask import Response, request

from api import auth, inputs, schemas, sse
from api.context import state


def resume_point(query: dict[str, Any]) -> int:
    """Where a follower starts: ``Last-Event-ID`` (what browsers send on reconnect) or ``?after=``."""
    header = request.headers.get("Last-Event-ID")
    if header is not None:
        inputs.check(header, schemas.LAST_EVENT_ID_HEADER, root="Last-Event-ID")
        value = int(header)
        inputs.check(value, schemas.EVENTS_QUERY["properties"]["after"], root="Last-Event-ID")
        return value
    after: int = query["after"]
    return after


# An event stream's frames, given the caller's token id (None: no token), which the shared
# poller checks every tick so that a revoked token's streams end.
Frames = Callable[[str | None], Iterator[str]]


def held_stream(frames: Frames) -> Response:
    """An event-stream response holding one of the caller's stream slots until it closes.

    Every event stream (jobs, receipts, objectives) goes through here, so the per-token and
    per-process caps and the end-on-revocation rule hold for all of them.
    """
    identity = auth.current()
    st = state()
    release = st.stream_slots.acquire(identity.token_id or "anonymous")
    try:
        response = sse.event_stream_response(frames(identity.token_id))
    except BaseException:
        release()
        raise
    response.call_on_close(release)
    return response


def sse_timing() -> sse.Timing:
    st = state()
    return sse.Timing(
        poll_ms=st.settings.sse_poll_ms,
        max_seconds=st.settings.sse_max_seconds,
        heartbeat_seconds=st.sse_heartbeat_seconds,
    )
