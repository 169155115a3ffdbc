"""A worker consumer whose broker reconnect starts at 1 s, doubles, and caps at 30 s.

Celery's consumer reconnects with kombu's linear retry (2, 4, 6 … s); the spec asks for a
doubling backoff so an idle worker keeps (or regains) its delivery connection quickly. It also
keeps a threads-pool worker without prefetch fetching promptly once a slot frees (see below).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from celery.worker.consumer import Consumer
from celery.worker.state import maybe_shutdown

from app.ops import dead_letters
from workers.runtime import FETCH_GATED

log = logging.getLogger("receipt.consumer")

RECONNECT_START_S = 1.0
RECONNECT_CAP_S = 30.0
# With worker_disable_prefetch, kombu's Redis transport stops polling for messages while every
# slot is busy and resumes on the event loop's next tick. A prefork pool's result pipe wakes the
# loop when a slot frees; a threads pool has nothing that does, so the loop slept until its next
# timer — up to 1 s — and a saturated worker fetched about one batch a second (measured with task
# events off: 30 x 50 ms tasks on 2 threads took 14 s instead of 0.8 s). A short no-op timer bounds
# that resume delay; task events only hid it by waking the loop as a side effect. Cost: an idle
# worker process used ~1.4 % of a core with it (0.1 % without; 0.6 % at 50 ms).
RESUME_TICK_S = 0.01


def reconnect_delays(start: float = RECONNECT_START_S, cap: float = RECONNECT_CAP_S) -> Iterator[float]:
    """1, 2, 4, 8, 16, 30, 30, … seconds."""
    delay = start
    while True:
        yield delay
        delay = min(cap, delay * 2)


def _tick() -> None:
    """Nothing: running at all makes the event loop re-check whether it may consume again."""


class BackoffConsumer(Consumer):  # type: ignore[misc]
    """Celery's consumer with a doubling reconnect loop that never gives up."""

    def register_with_event_loop(self, hub: Any) -> None:
        super().register_with_event_loop(hub)
        if self.app.conf.worker_disable_prefetch:
            hub.call_repeatedly(RESUME_TICK_S, _tick)
            self._gate_on_slots()

    def _gate_on_slots(self) -> None:
        """Fetch nothing while every slot of the process is taken (``workers/slots.py``).

        Celery counts a batch message as one task, but it runs several attempts: with its pool's
        threads alone as the limit, a process running a full batch would fetch more messages it
        cannot start while another worker idles. The tick above resumes fetching once a slot frees.
        """
        slots = getattr(self.app, "receipt_slots", None)
        qos = getattr(getattr(getattr(self, "task_consumer", None), "channel", None), "qos", None)
        if slots is None or qos is None or getattr(qos, "receipt_gated", False):
            return
        celery_can_consume = qos.can_consume

        def can_consume() -> bool:
            return bool(slots.free > 0 and celery_can_consume())

        qos.can_consume = can_consume
        qos.receipt_gated = True
        setattr(self.app, FETCH_GATED, True)

    def on_decode_error(self, message: Any, exc: Exception) -> None:
        """A body Celery cannot parse: kept as a dead letter, then Celery's own handling (log, ack)."""
        self._keep_dead_letter(message, f"body not decodable ({type(exc).__name__}: {exc})")
        super().on_decode_error(message, exc)

    def on_unknown_message(self, body: Any, message: Any) -> None:
        self._keep_dead_letter(message, "not a Celery task message")
        super().on_unknown_message(body, message)

    def on_invalid_task(self, body: Any, message: Any, exc: Exception) -> None:
        self._keep_dead_letter(message, f"invalid task message ({exc})")
        super().on_invalid_task(body, message, exc)

    def _keep_dead_letter(self, message: Any, reason: str) -> None:
        settings = getattr(self.app, "receipt_settings", None)
        try:
            info = getattr(message, "delivery_info", None) or {}
            queue = str(info.get("routing_key") or info.get("exchange") or "?")
            raw = message.body if isinstance(message.body, bytes) else str(message.body).encode()
            if settings is None:
                return
            store = dead_letters.store_for(settings)
            if isinstance(store, dead_letters.RedisDeadLetters):
                store.keep(queue, raw, reason)
            else:
                store.keep_copy(queue, raw, reason)
        except Exception:  # the evidence is lost; the consumer must go on regardless
            log.warning("could not keep an undecodable message as a dead letter", exc_info=True)

    def on_connection_error_after_connected(self, exc: Exception) -> None:
        """Drop the lost connection; never let its cleanup kill the worker.

        Celery closes the dead connection after ``collect()`` has already detached kombu's
        Redis transport. When the channel still holds a delivered-but-unacked message (a task
        with a countdown, such as beat's first redrive, or one waiting for a thread), closing it
        tries to restore that message through the detached transport and raises
        ``AttributeError: 'NoneType' object has no attribute 'hostname'``, which is not a
        connection error: it escaped as an "Unrecoverable error" and the worker exited with
        status 0 on a broker restart (reproduced in tests/e2e). The connection is dead either
        way, and a message that cannot be restored is recovered from receipts (lease expiry and
        the queued redrive), so the cleanup error is logged and the reconnect goes ahead.
        """
        try:
            super().on_connection_error_after_connected(exc)
        except Exception:
            log.warning("cleanup of the lost broker connection failed; reconnecting anyway", exc_info=True)
            self.connection = None

    def ensure_connected(self, conn: Any) -> Any:
        delays = reconnect_delays()
        while True:
            try:
                conn.connect()
                self.first_connection_attempt = False
                self.broker_connection_retry_attempt = 0
                return conn
            except conn.connection_errors as exc:
                delay = next(delays)
                self.broker_connection_retry_attempt += 1
                log.error("broker %s unreachable (%s); retrying in %.0f s", conn.as_uri(), exc, delay)
                maybe_shutdown()
                time.sleep(delay)
