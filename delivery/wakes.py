"""Coalesced wake-ups of the dispatch scanner: one message per scan, not per job.

Spec step 2: enqueue does not deliver the job it just created; it wakes a scanner pass. With a
Redis broker the ids of newly dispatchable jobs go onto one Redis list, and a wake-up *message* is
sent only when no scan is already armed (``SET NX`` on an "armed" key, in the same script as the
push: one command and one reply a push, atomic as a MULTI would be). The scanner disarms first,
then drains the list in batches; so every id pushed is drained by a scan that starts after the
push:

* the push found the key unset → it armed it and sends the message that starts such a scan;
* the push found it set → a scan is armed and has not disarmed yet; it disarms, then drains.

Nothing here is truth. A flushed or restarted Redis loses the list and the armed key together,
exactly like a lost wake-up message: the queued redrive re-delivers from receipts. The armed key
carries a short TTL, so a wake-up message lost while armed holds later ones back at most that long.

Listeners (one broker hop less per job). A driver process also blocks on the list
itself (``BLMPOP``, ``delivery/dispatch.py`` ``WakeListener``) and keeps a "listening" key alive while
it does. A push that finds that key sends no message at all: a listener is woken by the push
itself and drains the list the same way (disarm, then take), without a message being published,
routed, consumed and handed to a pool thread. A listener that dies leaves its key for at most
``LISTENING_TTL_MS``; pushes in that window wait for another listener, the next message-sending
push, or the queued redrive — the same cover as a lost wake-up message.

Worker processes listen too (``RECEIPT_WORKER_WAKES``, on by default). A worker process's listener
runs the same scan, and the attempts its passes claim for a queue it consumes run on its own free
slots with no worker message (``workers.attempts.LocalRuns``): the publish, the consumer's fetch
and the hand-off to its pool leave an idle job's path. While any worker listens (its "workers" key,
renewed before each wait like the listening key) a driver's listener stands back and takes no ids,
so every wake-up goes to a process that can run what it claims. A driver listens again at its next
wait once the last worker listener stops, and within ``LISTENING_TTL_MS`` more once it dies.

Without Redis (the embedded folder broker) there is no list: each wake-up carries its ids.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

log = logging.getLogger("receipt.wakes")

IDS_KEY = "receipt:wake:ids"
# A wake-up that names a worker queue rather than a job: a place freed there (a job ended), so its
# line may move. No job id starts with '@' (app/jobs/ids.py).
QUEUE_TOKEN = "@"
ARMED_KEY = "receipt:wake:armed"
ARMED_TTL_MS = 2_000
LISTENING_KEY = "receipt:wake:listening"
# Set while a worker process listens: a driver's listener stands back (it lives LISTENING_TTL_MS).
WORKERS_KEY = "receipt:wake:workers"
# Set while a worker queue's line holds jobs its last dispatch pass could not send (no free place,
# or heads left): a freed place there is worth a pass; elsewhere its token is dropped unread. Kept
# by every pass that leaves a line (a listener looks again every second while one waits), so the
# TTL only ends a mark whose driver died; the queued redrive still moves that line. Its value says
# whether that pass found no free place at all (``LINE_FULL``): a job joining such a line needs no
# pass of its own, the next freed place's pass weighs it.
LINE_KEY = "receipt:wake:line:"
LINE_FULL = b"full"
LINE_HELD = b"1"
LINE_TTL_MS = 30_000
LISTENING_TTL_MS = 3_000
# How long one blocking wait (BLMPOP, or BLPOP before Redis 7) lasts: the listener renews its key
# and checks for shutdown this often.
LISTEN_BLOCK_S = 1.0

# The push: the ids onto the list (in slices, under Lua's limit on unpacked arguments), arm the scan
# unless armed, and answer 1 when this push armed it and no listener is blocked on the list.
# KEYS: ids, armed, listening. ARGV: the armed key's TTL in ms, then the ids.
PUSH_SCRIPT = """
for i = 2, #ARGV, 1000 do
  redis.call('RPUSH', KEYS[1], unpack(ARGV, i, math.min(i + 999, #ARGV)))
end
local armed = redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[1])
if armed and redis.call('EXISTS', KEYS[3]) == 0 then
  return 1
end
return 0
"""


class WakeList:
    """The coalescing wake list on the broker's Redis."""

    def __init__(self, url: str, prefix: str = "") -> None:
        import redis

        self._client = redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        # The broker's own key prefix (kombu's ``global_keyprefix``), so deployments that share one
        # Redis under different prefixes never drain each other's ids.
        self.ids_key = prefix + IDS_KEY
        self.armed_key = prefix + ARMED_KEY
        self.listening_key = prefix + LISTENING_KEY
        self.workers_key = prefix + WORKERS_KEY
        self.line_prefix = prefix + LINE_KEY
        self._multi_pop = True  # until the server says it has no BLMPOP
        # EVALSHA, loading the script again after a restart or SCRIPT FLUSH emptied the cache.
        self._push = self._client.register_script(PUSH_SCRIPT)

    def push(self, ids: Sequence[str]) -> bool:
        """Add ids; True when the caller must send the wake-up message: this push armed the scan
        and no listener is blocked on the list (a listener is woken by the push itself)."""
        if not ids:
            return False
        keys = [self.ids_key, self.armed_key, self.listening_key]
        return bool(self._push(keys=keys, args=[ARMED_TTL_MS, *ids]))

    def listen(
        self, count: int, block_s: float = LISTEN_BLOCK_S, *, worker: bool = False
    ) -> list[str] | None:
        """A listener's wait: disarm and announce itself, then block up to ``block_s`` until ids
        come and take up to ``count`` of them (an empty list when none came).

        The disarm comes before the wait rather than after the take, so an id costs one blocking
        call and nothing more (``BLMPOP``, Redis ≥ 7; older servers get ``BLPOP`` and a take). Any
        id pushed after the disarm is returned by this wait or the next, as every id pushed after
        a scan's disarm is drained by that scan.

        ``worker``: a worker process's listener, which also announces itself as one. A driver's
        (``worker=False``) stands back while a worker listens: it returns None at once, taking
        nothing, and its caller waits ``block_s`` before asking again.
        """
        from redis.exceptions import ResponseError

        pipe = self._client.pipeline(transaction=False)
        pipe.delete(self.armed_key)
        # Renewed by a driver that stands back too (one round trip, no condition): a worker listens
        # then, and a dead worker's key lapses within LISTENING_TTL_MS, when the driver takes over.
        pipe.set(self.listening_key, b"1", px=LISTENING_TTL_MS)
        if worker:
            pipe.set(self.workers_key, b"1", px=LISTENING_TTL_MS)
        else:
            pipe.exists(self.workers_key)
        answers = pipe.execute()
        if not worker and answers[-1]:
            return None
        if self._multi_pop:
            try:
                got = self._client.blmpop(block_s, 1, self.ids_key, direction="LEFT", count=count)
            except ResponseError as exc:
                if "unknown command" not in str(exc).lower():
                    raise
                self._multi_pop = False  # a Redis before 7.0
            else:
                return _decoded(got[1]) if got else []
        first = self._client.blpop([self.ids_key], timeout=block_s)
        if first is None:
            return []
        return _decoded([first[1]]) + (self.take(count - 1) if count > 1 else [])

    def stop_listening(self, *, worker: bool = False) -> None:
        """A listener that stops on purpose withdraws its key, so pushes send messages again at once
        (with several listeners this may briefly send messages that one of them makes redundant).
        A worker's also withdraws the workers key, so a driver listens again at its next wait
        (another worker still listening sets it again before its own)."""
        keys = [self.listening_key, self.workers_key] if worker else [self.listening_key]
        self._client.delete(*keys)

    def disarm(self) -> None:
        self._client.delete(self.armed_key)

    def disarm_and_take(self, count: int) -> list[str]:
        """``disarm`` then ``take``, in one round trip (a scan's start)."""
        pipe = self._client.pipeline(transaction=True)
        pipe.delete(self.armed_key)
        pipe.lpop(self.ids_key, count)
        _, raw = pipe.execute()
        return _decoded(raw)

    def take(self, count: int) -> list[str]:
        """Up to ``count`` ids, oldest first (an empty list when drained)."""
        return _decoded(self._client.lpop(self.ids_key, count))

    def mark_line(self, queue: str, waiting: bool, full: bool = False) -> None:
        """Record whether ``queue``'s line holds jobs its pass left waiting, and whether that pass
        found no free place (``full``)."""
        if waiting:
            self._client.set(self.line_prefix + queue, LINE_FULL if full else LINE_HELD, px=LINE_TTL_MS)
        else:
            self._client.delete(self.line_prefix + queue)

    def line_marks(self, queues: Sequence[str]) -> dict[str, bytes]:
        """The marks of the lines among ``queues`` that hold jobs left waiting (one round trip)."""
        if not queues:
            return {}
        found = self._client.mget([self.line_prefix + q for q in queues])
        return {
            q: v if isinstance(v, bytes) else str(v).encode()
            for q, v in zip(queues, found, strict=True)
            if v is not None
        }

    def lines_waiting(self, queues: Sequence[str]) -> set[str]:
        """The queues among ``queues`` whose line holds jobs left waiting (one round trip)."""
        return set(self.line_marks(queues))


def _decoded(raw: Any) -> list[str]:
    return [r.decode() if isinstance(r, bytes) else str(r) for r in (raw or [])]


def wake(send: Callable[[list[str]], None], wakes: WakeList | None, ids: Sequence[str]) -> None:
    """Wake the scanner for ``ids``: through the wake list when there is one, else in the message.

    ``send(ids)`` publishes the wake-up message. When the list cannot be reached the ids travel
    in the message itself, as without Redis; when the message cannot be sent after arming, the
    key is dropped so the next enqueue arms (and sends) again, and the error propagates.
    """
    if not ids:
        return
    if wakes is not None:
        try:
            armed = wakes.push(ids)
        except Exception as exc:  # the list is an optimisation: fall back to carrying the ids
            log.warning("wake list unavailable (%s); the wake-up carries its ids", exc)
        else:
            if not armed:
                return
            try:
                send([])
            except Exception:
                with contextlib.suppress(Exception):
                    wakes.disarm()
                raise
            return
    send(list(ids))


def wake_list_for(
    redis_url: str | None, transport_options: Mapping[str, Any] | None = None
) -> WakeList | None:
    """The wake list on the broker's Redis (under its key prefix), or None when it is not Redis."""
    if not redis_url or not redis_url.startswith(("redis://", "rediss://", "unix://")):
        return None
    return WakeList(redis_url, str((transport_options or {}).get("global_keyprefix", "")))
