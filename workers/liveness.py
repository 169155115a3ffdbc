"""This worker process's liveness: renewed every couple of seconds, and the self-fence.

The rules and the margin between the two thresholds are in ``app/jobs/liveness.py``; the record in
``app/storage/liveness.py``. Two daemon threads:

- ``renew``: renews the record every ``RECEIPT_WORKER_LIVENESS_INTERVAL_MS``. It may block on a
  database that stopped answering; nothing else waits for it.
- ``watch``: every ``FENCE_CHECK_MS``, and without touching the network, fences the process when
  its last successful renewal *started* more than ``RECEIPT_WORKER_SELF_FENCE_MS`` ago, or at once
  when a renewal finds the record declared dead.

Fencing cancels every attempt running under the current identity with reason ``worker_fenced``
(the codex handler then SIGKILLs its command's whole tree; the runner returns without writing
anything), and moves the process to a new identity (a new epoch), so attempts it starts later are
not mistaken for the fenced ones, whose jobs the ``worker-liveness`` loop expires once the old
record lapses. A fenced identity is never renewed again.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import socket
import threading
import time
import uuid
import weakref
from collections import deque
from collections.abc import Callable

from sqlalchemy.engine import Engine

from app.config import Settings
from app.jobs import liveness as rules
from app.storage import liveness as records
from app.storage.db import make_engine
from workers.handler import JobContext

log = logging.getLogger("receipt.liveness")

# libpq counts whole seconds (and treats less than 2 as 2).
CONNECT_TIMEOUT_S = 2


def _hex(digits: int) -> str:
    return uuid.uuid4().hex[:digits]


def process_base(settings: Settings) -> str:
    return settings.worker_id or f"{socket.gethostname()}:{os.getpid()}"


def liveness_engine(settings: Settings) -> Engine:
    """An engine of its own for the renewals: a worker whose pool is busy with its handlers' queries
    must not miss renewals waiting for a connection, and fence itself for that. One connection (and
    one spare), given up on after ``CONNECT_TIMEOUT_S`` when the database does not answer."""
    url = settings.sqlalchemy_url
    if url.startswith("sqlite"):
        return make_engine(url)
    return make_engine(
        url,
        idle_in_transaction_ms=settings.db_idle_in_transaction_ms,
        pool_size=1,
        max_overflow=1,
        pool_timeout=CONNECT_TIMEOUT_S,
        connect_args={"connect_timeout": CONNECT_TIMEOUT_S},
    )


class ProcessLiveness:
    """The liveness of one worker process (one per process: ``install``/``current``)."""

    def __init__(
        self,
        engine: Engine,
        settings: Settings,
        role: str,
        *,
        clock: Callable[[], float] = time.monotonic,
        base: str | None = None,
        offer: records.Offer | None = None,
    ) -> None:
        self.engine = engine
        self.role = role
        # What the dispatch pass may send this process (its queues and slots); None: nothing.
        self.offer = offer
        self.interval_s = settings.worker_liveness_interval_ms / 1000
        self.self_fence_ms = settings.worker_self_fence_ms
        self.clock = clock
        self.base = base or process_base(settings)
        self._lock = threading.Lock()
        self.process = rules.process_id(self.base, _hex(rules.EPOCH_HEX))
        self._last_ok = clock()
        self._attempts: weakref.WeakSet[JobContext] = weakref.WeakSet()
        self._kills: weakref.WeakKeyDictionary[JobContext, list[Callable[[], None]]] = (
            weakref.WeakKeyDictionary()
        )
        self._fenced: set[str] = set()
        # The latest fences, (identity, why, attempts cancelled): one every self-fence while cut off.
        self.fences: deque[tuple[str, str, int]] = deque(maxlen=100)
        self._stop = threading.Event()
        self._renew_now = threading.Event()
        self._threads = [
            threading.Thread(target=self._renew_loop, name="receipt-liveness-renew", daemon=True),
            threading.Thread(target=self._watch_loop, name="receipt-liveness-watch", daemon=True),
        ]
        self._outage_logged = False

    # -- identities and attempts
    def holder_id(self) -> str:
        """A lease holder id for a new attempt under the current identity."""
        with self._lock:
            return rules.holder_id(self.process, _hex(8))

    def track(self, ctx: JobContext) -> None:
        """Count ``ctx`` among this process's attempts, so a fence of its identity cancels it.

        Held weakly and never removed: cancelling an attempt that already ended changes nothing."""
        identity = ctx.worker_id[:-8] if len(ctx.worker_id) > 8 else ctx.worker_id
        with self._lock:
            fenced = identity in self._fenced
            self._attempts.add(ctx)
        if fenced:  # its identity was fenced between the lease and now
            ctx.cancel(rules.FENCED)

    def on_fence(self, ctx: JobContext, kill: Callable[[], None]) -> Callable[[], None]:
        """Have a fence of ``ctx``'s identity call ``kill`` itself (from the watch thread), not only
        cancel ``ctx``: a handler thread blocked on the unreachable database would not see the
        cancellation. Returns the call that withdraws it."""
        with self._lock:
            self._kills.setdefault(ctx, []).append(kill)

        def withdraw() -> None:
            with self._lock:
                kills = self._kills.get(ctx)
                if kills is not None and kill in kills:
                    kills.remove(kill)

        return withdraw

    def _of(self, identity: str) -> list[JobContext]:
        return [c for c in self._attempts if c.worker_id.startswith(identity) and c.worker_id != identity]

    # -- start and stop
    def start(self) -> None:
        started = self.clock()
        try:
            records.register(self.engine, self.process, self.role, self.offer)
            with self._lock:
                self._last_ok = started
        except Exception as exc:  # the renew thread inserts it once the database answers
            log.warning("could not record this worker's liveness at start: %s", exc)
        for t in self._threads:
            t.start()
        log.info(
            "worker liveness %s: renewed every %.1f s; fences itself after %d ms without a renewal",
            self.process,
            self.interval_s,
            self.self_fence_ms,
        )

    def stop(self) -> None:
        """Stop renewing; a process stopping with no job leased under its identity deletes its record
        (one that still holds a lease leaves it to lapse, and the worker-liveness loop expires it)."""
        self._stop.set()
        self._renew_now.set()
        for t in self._threads:
            if t.is_alive():
                t.join(timeout=5)
        try:
            records.forget_unless_holding(self.engine, self.process)
        except Exception as exc:
            log.warning("could not delete this worker's liveness record: %s", exc)

    def withdraw_offer(self) -> None:
        """Offer the dispatch pass no more slots (the process stops taking work), from the next
        renewal, which starts at once."""
        if self.offer is not None and self.offer.slots:
            self.offer = dataclasses.replace(self.offer, slots=0)
            self._renew_now.set()

    # -- renewing
    def renew_once(self) -> None:
        started = self.clock()
        with self._lock:
            identity = self.process
        try:
            outcome = records.renew(self.engine, identity, self.role, self.offer)
        except Exception as exc:
            if not self._outage_logged:
                log.warning("worker liveness %s: renewal failed: %s", identity, exc)
                self._outage_logged = True
            return
        if self._outage_logged:
            log.info("worker liveness %s: renewed again", identity)
            self._outage_logged = False
        if outcome == "dead":
            self.fence(identity, "its record was declared dead")
            return
        with self._lock:
            if identity == self.process:
                self._last_ok = max(self._last_ok, started)

    def _renew_loop(self) -> None:
        while not self._stop.is_set():
            self._renew_now.wait(self.interval_s)
            self._renew_now.clear()
            if self._stop.is_set():
                return
            try:
                self.renew_once()
            except Exception:  # the thread must outlive a bug: the watch fences while it cannot renew
                log.exception("worker liveness renewal raised")

    # -- fencing
    def check(self) -> bool:
        """Fence the current identity if its deadline passed; True when it did."""
        with self._lock:
            identity = self.process
            due = rules.fence_due(self._last_ok, self.clock(), self.self_fence_ms)
        if due:
            self.fence(identity, f"no liveness renewal for {self.self_fence_ms} ms")
        return due

    def _watch_loop(self) -> None:
        while not self._stop.wait(rules.FENCE_CHECK_MS / 1000):
            self.check()

    def fence(self, identity: str, why: str) -> None:
        """Cancel every attempt of ``identity`` (their commands are killed) and move to a new one."""
        with self._lock:
            if identity in self._fenced or identity != self.process:
                return
            self._fenced.add(identity)
            cancelled = self._of(identity)
            kills = [k for c in cancelled for k in self._kills.get(c, ())]
            self.process = rules.process_id(self.base, _hex(rules.EPOCH_HEX))
            self._last_ok = self.clock()
            self.fences.append((identity, why, len(cancelled)))
        for ctx in cancelled:
            ctx.cancel(rules.FENCED)
        for kill in kills:
            try:
                kill()
            except Exception:  # the handler's own kill path (on cancellation) still runs
                log.exception("killing a fenced attempt's command failed")
        level = logging.ERROR if cancelled else logging.INFO
        log.log(
            level,
            "worker fenced itself as %s (%s): cancelled its %d attempts and killed their commands; now %s",
            identity,
            why,
            len(cancelled),
            self.process,
        )
        self._renew_now.set()


_CURRENT: ProcessLiveness | None = None


def install(liveness: ProcessLiveness | None) -> None:
    global _CURRENT
    _CURRENT = liveness


def current() -> ProcessLiveness | None:
    return _CURRENT


def track(ctx: JobContext) -> None:
    """``ProcessLiveness.track`` of this process's liveness; nothing when none is installed."""
    live = _CURRENT
    if live is not None:
        live.track(ctx)


def on_fence(ctx: JobContext, kill: Callable[[], None]) -> Callable[[], None]:
    """``ProcessLiveness.on_fence`` of this process's liveness; a no-op when none is installed."""
    live = _CURRENT
    if live is None:
        return lambda: None
    return live.on_fence(ctx, kill)
