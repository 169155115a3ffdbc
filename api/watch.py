"""One poller per API process for every open event stream.

An event-stream follower does not poll on its own. It subscribes the streams it follows (with
the last seq it has read of each) and its token, then waits. One poller thread asks the database,
once per tick (``RECEIPT_SSE_POLL_MS``), for the heads of every subscribed stream and which of
the subscribers' tokens are still live — one statement (``app.storage.heads``) however many
streams are open — and wakes only the subscribers whose streams advanced, whose token was
revoked or expired, or all of them when that read failed. A woken follower reads its own new
receipts: per-stream seq is gap-free, so ``seq > last read`` is exact, and a receipt committed
after a tick is seen by the next one (its head is then past what the follower read).

With no subscriber the thread ends; the next subscription starts another. Under gunicorn's
gevent worker ``threading`` is monkey-patched before the app is built, so the poller is a
greenlet and its waits and ``Event``s are gevent's (looked up at call time, like ``time.sleep``);
psycogreen makes its database round trip yield to the hub.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Mapping

from sqlalchemy.engine import Connection, Engine

from app.storage import heads
from app.storage.db import read_connection

log = logging.getLogger("receipt.api")


class Subscription:
    """One follower's streams (stream → last seq it read), its token, and why it was woken."""

    def __init__(self, poller: StreamPoller, streams: Mapping[str, int], token_id: str | None) -> None:
        self._poller = poller
        self.token_id = token_id
        self._seen: dict[str, int] = dict(streams)
        self._heads: dict[str, int] = {}
        self._event = threading.Event()
        self.revoked = False
        self.failed = False
        self.wakes = 0  # how often the poller woke this subscriber (tests read it)

    # -- the follower's side --------------------------------------------------------------------

    def watch(self, stream: str, seen: int) -> None:
        """Follow ``stream`` too, having read it up to ``seen``."""
        with self._poller.lock:
            self._seen[stream] = seen

    def unwatch(self, stream: str) -> None:
        with self._poller.lock:
            self._seen.pop(stream, None)
            self._heads.pop(stream, None)

    def read_up_to(self, stream: str, seq: int) -> None:
        """The follower has read ``stream`` up to ``seq``."""
        with self._poller.lock:
            if stream in self._seen:
                self._seen[stream] = max(self._seen[stream], seq)

    def advanced(self) -> dict[str, int]:
        """The streams whose head (at the last tick) is past what was read: stream → that head."""
        with self._poller.lock:
            return {s: h for s, h in self._heads.items() if h > self._seen.get(s, h)}

    def wait(self, timeout: float) -> None:
        """Until the poller wakes this subscriber, or ``timeout`` seconds."""
        self._event.wait(max(timeout, 0.0))
        self._event.clear()

    def close(self) -> None:
        self._poller.unsubscribe(self)

    # -- the poller's side ----------------------------------------------------------------------

    def _wake(self) -> None:
        self.wakes += 1
        self._event.set()


class StreamPoller:
    """The per-process poller; ``ticks`` counts its database reads (tests and the bench read it)."""

    def __init__(self, engine: Engine, poll_ms: int) -> None:
        self.engine = engine
        self.poll_ms = poll_ms
        self.lock = threading.Lock()
        self._subscribers: set[Subscription] = set()
        self._running = False
        self._conn: Connection | None = None  # the poller thread's own (see ``_connection``)
        self._held = contextlib.ExitStack()  # keeps ``_conn`` checked out until it is released
        self.ticks = 0

    def subscribe(self, streams: Mapping[str, int], token_id: str | None) -> Subscription:
        """Follow ``streams`` (stream → seq read so far); ``token_id`` is checked every tick."""
        sub = Subscription(self, streams, token_id)
        with self.lock:
            self._subscribers.add(sub)
            start = not self._running
            self._running = True
        if start:
            threading.Thread(target=self._run, name="receipt-sse-poller", daemon=True).start()
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        with self.lock:
            self._subscribers.discard(sub)

    @property
    def subscribers(self) -> int:
        with self.lock:
            return len(self._subscribers)

    def _run(self) -> None:
        while True:
            with self.lock:
                if not self._subscribers:
                    self._running = False
                    conn, self._conn = self._conn, None
                    break
            self.tick()
            time.sleep(self.poll_ms / 1000)
        if conn is not None:
            # Back to the pool: an idle process holds no connection. A server gone meanwhile
            # only loses this connection.
            self._release()

    def _connection(self) -> Connection:
        # Held while any stream is open: a checkout per tick would add the pool's pre-ping and
        # two isolation-level statements (AUTOCOMMIT on, then reset) to every tick.
        if self._conn is None:
            self._conn = self._held.enter_context(read_connection(self.engine))
        return self._conn

    def _release(self) -> None:
        held, self._held = self._held, contextlib.ExitStack()
        with contextlib.suppress(Exception):
            held.close()

    def tick(self) -> None:
        """One read for every subscriber; wake those with something to do."""
        with self.lock:
            subs = list(self._subscribers)
            streams = {s for sub in subs for s in sub._seen}
            token_ids = {sub.token_id for sub in subs if sub.token_id is not None}
        if not subs:
            return
        try:
            self.ticks += 1
            conn = self._connection()
            found = heads.read(conn, streams, token_ids)
            conn.rollback()  # ends SQLite's read transaction; nothing to end under AUTOCOMMIT
        except Exception:
            # Every follower ends its stream; its client reconnects with Last-Event-ID. The
            # connection is discarded: the next tick (new subscribers) opens a fresh one.
            log.warning("event streams ended: the shared poll failed", exc_info=True)
            broken, self._conn = self._conn, None
            if broken is not None:
                with contextlib.suppress(Exception):
                    broken.invalidate()
                self._release()
            for sub in subs:
                sub.failed = True
                sub._wake()
            return
        for sub in subs:
            if sub.token_id is not None and sub.token_id not in found.live_tokens:
                sub.revoked = True
                sub._wake()
                continue
            woken = False
            with self.lock:
                for stream, seen in sub._seen.items():
                    head = found.seqs.get(stream)
                    if head is not None:
                        sub._heads[stream] = head
                        woken = woken or head > seen
            if woken:
                sub._wake()
