"""The threads that run dispatch passes without a message: a driver's wake listener, a worker's refill.

Both run ``delivery.dispatch``'s passes in a thread of their own, and both look again at a line
their last pass says may move without a wake-up (a rate limiter's next admission, a line left with
no free place) within ``LINE_TICK_S``. Errors back off from 0.5 s, doubling to 30 s.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable, Sequence

from app.jobs.routing import QUEUES
from app.ops.shutdown import PROCESS
from delivery.dispatch import CLAIM_BATCH, dispatch_queue, drain_wakes, freed_waiting, hand_back_wakes
from delivery.dispatcher import Dispatcher
from delivery.wakes import LISTEN_BLOCK_S

log = logging.getLogger("receipt.dispatch")

LISTENER_BACKOFF_S = 0.5
LISTENER_BACKOFF_MAX_S = 30.0
# How often a listener looks again at a line that no wake-up may move (no free place when its last
# pass ran, or heads were left); and its shortest wait (a rate limiter's next admission).
LINE_TICK_S = 1.0
MIN_BLOCK_S = 0.01


class WakeListener:
    """A process's scanner that blocks on the wake list itself (``delivery/wakes.py``).

    While it listens, enqueues send no wake-up message: the push wakes it, and it runs the same
    scan a ``receipt.dispatch`` message would have (disarm, take, claim, drive inline), in this
    thread — one broker publish, fetch and pool hand-off less per idle job. Errors (Redis or
    Postgres down) back off from 0.5 s, doubling to 30 s; the key it stops renewing then expires,
    and pushes fall back to messages.

    ``queues``: the listener of a worker process (``RECEIPT_WORKER_WAKES``), on the lists of the
    worker queues it consumes; its ``rt`` runs what its passes claim for this process's free slots
    here (``rt.local``): no worker message at all. A driver's listener (no ``queues``) waits on the
    driver's list, and about once a second takes over the ids of a queue's list whose last worker
    listener died (``WakeList.adopt``).
    """

    def __init__(self, rt: Dispatcher, *, queues: Sequence[str] = ()) -> None:
        assert rt.wakes is not None
        self.rt = rt
        self.wakes = rt.wakes
        self.queues = tuple(queues)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="receipt-wake-listener", daemon=True)
        self.scans = 0
        self.adopted = 0  # ids a driver's listener took over from worker queues' lists (tests)
        self._adopt_at = 0.0

    @property
    def worker(self) -> bool:
        return bool(self.queues)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=LISTEN_BLOCK_S + 5)
        self._withdraw()

    def _withdraw(self) -> None:
        """Listen no more: a driver's key goes; a worker's queues' keys go and what their lists
        hold goes to the driver's list (with the wake-up message if no driver listens)."""
        with contextlib.suppress(Exception):
            hand_back_wakes(self.rt, [], self.queues)

    def _run(self) -> None:
        backoff = LISTENER_BACKOFF_S
        while not self._stop.is_set():
            if self.worker and PROCESS.requested:
                # A worker shutting down runs nothing more here: the driver or another worker
                # takes the wake-ups from now on.
                self._withdraw()
                return
            try:
                block_s = self._block_s()
                self._adopt_orphans()
                batch = self.wakes.listen(CLAIM_BATCH, block_s, queues=self.queues)
                if batch and (self._stop.is_set() or PROCESS.requested):
                    hand_back_wakes(self.rt, batch, self.queues)
                    break
                if batch:
                    drain_wakes(self.rt, batch, self.queues)
                    self.scans += 1
                for queue in self._due():
                    dispatch_queue(self.rt, queue)
                backoff = LISTENER_BACKOFF_S
            except Exception as exc:
                log.warning("wake listener: %s; listening again in %.1f s", exc, backoff)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, LISTENER_BACKOFF_MAX_S)

    def _block_s(self) -> float:
        return look_again_in_s(self.rt)

    def _adopt_orphans(self) -> None:
        """A driver's listener, at most once per ``LISTEN_BLOCK_S``: take over the ids left on a
        worker queue's list whose last listener died without handing them back."""
        now = time.monotonic()
        if self.worker or now < self._adopt_at:
            return
        self._adopt_at = now + LISTEN_BLOCK_S
        self.adopted += self.wakes.adopt(list(QUEUES.values()))

    def _due(self) -> list[str]:
        return lines_due(self.rt)


def _again_at(rt: Dispatcher) -> dict[str, float]:
    """Each queue whose line may move without a wake-up, and when (monotonic): from this process's
    latest pass over it, or a look it owes a full line that jobs joined without a pass."""
    out = dict(rt.looks)
    for queue, (ran_at, result) in list(rt.passes.items()):
        again = result.again_in_s(LINE_TICK_S)
        if again is not None:
            out[queue] = min(ran_at + again, out.get(queue, float("inf")))
    return out


def look_again_in_s(rt: Dispatcher) -> float:
    """How long a process that runs passes may wait before one of its lines is due a look again
    (at most ``LISTEN_BLOCK_S``, at least ``MIN_BLOCK_S``)."""
    due = _again_at(rt)
    if not due:
        return LISTEN_BLOCK_S
    return min(LISTEN_BLOCK_S, max(MIN_BLOCK_S, min(due.values()) - time.monotonic()))


def lines_due(rt: Dispatcher) -> list[str]:
    """The queues whose line is due a look again now."""
    now = time.monotonic()
    return sorted(queue for queue, at in _again_at(rt).items() if at <= now)


class Refill:
    """A worker process refills the places its own attempts free, in this thread of its own.

    A place frees when an attempt ends. Where its line holds jobs waiting (the mark every pass
    keeps, ``delivery/wakes.py``), this process runs that line's pass itself, as soon as the
    settlement has committed: no wake-up travels to a driver and back, so under load a freed place
    is taken again within one pass rather than after a broker round trip and whatever the driver's
    listener is busy with. The asks of the attempts that end during a pass fold into the next
    one. This process's passes are looked at again as the driver's are (a rate limiter's next
    admission, a line left with no place free), and a process that starts fills its new places at
    once. A pass that fails hands its lines to the driver as wake-ups (``@<queue>``), as an ended
    attempt in a process without this thread does.
    """

    def __init__(self, rt: Dispatcher, queues: Sequence[str]) -> None:
        self.rt = rt
        self.queues = tuple(queues)
        self._cond = threading.Condition()
        self._asked: set[str] = set()
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="receipt-refill", daemon=True)
        self.passes = 0
        self.served = 0  # asks taken and answered (with a pass or without: no line waited)
        self.coalesce_s = rt.settings.refill_coalesce_ms / 1000

    def start(self) -> None:
        self.rt.delivery.on_freed = self.ask
        self.ask(self.queues)  # this process's places are new: a line waiting there can move now
        self._thread.start()

    def stop(self) -> None:
        """Ended attempts' places go to the driver again; an ask not yet served is handed to it."""
        self.rt.delivery.on_freed = None
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join(timeout=LISTEN_BLOCK_S + 5)
        with self._cond:
            left, self._asked = self._asked, set()
        self._hand_to_driver(left)

    def ask(self, queues: Iterable[str]) -> None:
        """Places freed in ``queues`` (called after the settlement's commit; never blocks on I/O)."""
        with self._cond:
            self._asked.update(queues)
            self._cond.notify()

    def _take(self, wait_s: float) -> set[str] | None:
        """The queues asked for, once there are any or ``wait_s`` passed; None once stopping. Once
        asked, the asks of ``RECEIPT_REFILL_COALESCE_MS`` more fold into the same pass: under load
        places free one by one, and one pass for several costs the same round trips as for one,
        while the lead's messages (``RECEIPT_DISPATCH_LEAD``) keep the slots fed meanwhile."""
        with self._cond:
            if not self._asked and not self._stopping:
                self._cond.wait(wait_s)
            if self._asked and self.coalesce_s > 0:
                until = time.monotonic() + self.coalesce_s
                while not self._stopping and (left := until - time.monotonic()) > 0:
                    self._cond.wait(left)
            if self._stopping:
                return None
            asked, self._asked = self._asked, set()
            return asked

    def _run(self) -> None:
        backoff = LISTENER_BACKOFF_S
        while True:
            asked = self._take(look_again_in_s(self.rt))
            if asked is None:
                return
            try:
                for queue in sorted(self._waiting(asked) | set(lines_due(self.rt))):
                    dispatch_queue(self.rt, queue)
                    self.passes += 1
                backoff = LISTENER_BACKOFF_S
            except Exception as exc:
                log.warning("refill: %s; the driver moves these lines; again in %.1f s", exc, backoff)
                self._hand_to_driver(asked)
                with self._cond:
                    if not self._stopping:
                        self._cond.wait(backoff)
                backoff = min(backoff * 2, LISTENER_BACKOFF_MAX_S)
            self.served += bool(asked)

    def _waiting(self, asked: set[str]) -> set[str]:
        """Of the queues asked for, those whose line holds jobs waiting: known from this process's
        own pass over it within the last tick, else from the lines' marks."""
        now = time.monotonic()
        known = set()
        for queue in asked:
            latest = self.rt.passes.get(queue)
            if latest is not None and now - latest[0] < LINE_TICK_S and latest[1].line_waiting:
                known.add(queue)
        return known | freed_waiting(self.rt, asked - known)

    def _hand_to_driver(self, queues: set[str]) -> None:
        if not queues:
            return
        try:
            self.rt.delivery.wake_queues(sorted(queues))
        except Exception:  # best-effort, like every wake-up: the queued redrive moves these lines
            log.exception("refill: could not hand %d lines to the driver", len(queues))
