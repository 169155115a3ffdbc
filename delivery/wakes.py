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

Worker processes listen too (``RECEIPT_WORKER_WAKES``, on by default), each on a list of its own
worker queues: ``receipt:wake:ids:<queue>``. A worker process's listener runs the same scan, and the
attempts its passes claim for a queue it consumes run on its own free slots with no worker message
(``workers.attempts.LocalRuns``): the publish, the consumer's fetch and the hand-off to its pool
leave an idle job's path. A push sends a job's id to its queue's list while a worker listens there
(that queue's listening key, renewed before each wait), else to the driver's list, so a chat job's
wake-up reaches a process that consumes chat, never a codex or control worker that could only
send it on as a message. Freed places' tokens and ids handed back go to the driver's list. A worker
that stops on purpose withdraws its queues' keys and hands what its lists hold to the driver's; one
that dies leaves its keys for at most ``LISTENING_TTL_MS``, after which the driver's listener, about
once a second, moves the ids of any queue list nobody listens to onto its own (``ADOPT_SCRIPT``).

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
# A worker queue's own list, and its listening key, set while a worker process that consumes that
# queue listens (it lives LISTENING_TTL_MS): ``QUEUE_IDS_KEY + queue``, ``QUEUE_LISTENING_KEY + queue``.
QUEUE_IDS_KEY = "receipt:wake:ids:"
QUEUE_LISTENING_KEY = "receipt:wake:listening:"
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

# The push. Each worker queue's ids onto that queue's list while a worker listens there, else onto
# the driver's list with the ids of no queue; when the driver's list got any, arm the scan unless
# armed, and answer 1 when this push armed it and no driver listener is blocked on the list. Ids
# go to RPUSH in slices, under Lua's limit on unpacked arguments.
# KEYS: the driver's ids, armed, listening, then per queue its ids and its listening key.
# ARGV: the armed key's TTL in ms, the number of ids of each queue in KEYS' order, then the ids:
# each queue's in that order, then those of no queue.
PUSH_SCRIPT = """
local queues = (#KEYS - 3) / 2
local at = 2 + queues
local driver = {}
for q = 1, queues do
  local n = tonumber(ARGV[1 + q])
  if redis.call('EXISTS', KEYS[3 + 2 * q]) == 1 then
    for i = at, at + n - 1, 1000 do
      redis.call('RPUSH', KEYS[2 + 2 * q], unpack(ARGV, i, math.min(i + 999, at + n - 1)))
    end
  else
    for i = at, at + n - 1 do driver[#driver + 1] = ARGV[i] end
  end
  at = at + n
end
for i = at, #ARGV do driver[#driver + 1] = ARGV[i] end
if #driver == 0 then
  return 0
end
for i = 1, #driver, 1000 do
  redis.call('RPUSH', KEYS[1], unpack(driver, i, math.min(i + 999, #driver)))
end
local armed = redis.call('SET', KEYS[2], '1', 'NX', 'PX', ARGV[1])
if armed and redis.call('EXISTS', KEYS[3]) == 0 then
  return 1
end
return 0
"""

# The driver's adoption, about once a second: the ids on a worker queue's list whose listening key
# is gone (its last listener died) move onto the driver's list. Answers how many moved.
# KEYS: the driver's ids, then per queue its ids and its listening key.
ADOPT_SCRIPT = """
local moved = 0
for q = 1, (#KEYS - 1) / 2 do
  if redis.call('EXISTS', KEYS[1 + 2 * q]) == 0 then
    local ids = redis.call('LRANGE', KEYS[2 * q], 0, -1)
    if #ids > 0 then
      redis.call('DEL', KEYS[2 * q])
      for i = 1, #ids, 1000 do
        redis.call('RPUSH', KEYS[1], unpack(ids, i, math.min(i + 999, #ids)))
      end
      moved = moved + #ids
    end
  end
end
return moved
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
        self.prefix = prefix
        self.line_prefix = prefix + LINE_KEY
        self._multi_pop = True  # until the server says it has no BLMPOP
        # EVALSHA, loading the script again after a restart or SCRIPT FLUSH emptied the cache.
        self._push = self._client.register_script(PUSH_SCRIPT)
        self._adopt = self._client.register_script(ADOPT_SCRIPT)

    def queue_ids_key(self, queue: str) -> str:
        return self.prefix + QUEUE_IDS_KEY + queue

    def queue_listening_key(self, queue: str) -> str:
        return self.prefix + QUEUE_LISTENING_KEY + queue

    def push(self, ids: Sequence[str], queues: Sequence[str | None] | None = None) -> bool:
        """Add ids, each to its worker queue's list while a worker listens there (``queues``: each
        id's queue, None for an id of none, such as a freed place's token), else to the driver's.
        True when the caller must send the wake-up message: this push armed the driver's scan and
        no driver listener is blocked on its list (a listener is woken by the push itself)."""
        if not ids:
            return False
        by_queue: dict[str, list[str]] = {}
        driver: list[str] = []
        for job_id, queue in zip(ids, queues if queues is not None else [None] * len(ids), strict=True):
            if queue is None:
                driver.append(job_id)
            else:
                by_queue.setdefault(queue, []).append(job_id)
        keys = [self.ids_key, self.armed_key, self.listening_key]
        for queue in by_queue:
            keys += [self.queue_ids_key(queue), self.queue_listening_key(queue)]
        args: list[str | int] = [ARMED_TTL_MS, *(len(group) for group in by_queue.values())]
        args += [i for group in by_queue.values() for i in group] + driver
        return bool(self._push(keys=keys, args=args))

    def listen(self, count: int, block_s: float = LISTEN_BLOCK_S, *, queues: Sequence[str] = ()) -> list[str]:
        """A listener's wait: announce itself, then block up to ``block_s`` until ids come and take
        up to ``count`` of them (an empty list when none came).

        The driver's listener (no ``queues``) waits on the driver's list. It disarms first: the
        disarm comes before the wait rather than after the take, so an id costs one blocking call
        and nothing more (``BLMPOP``, Redis ≥ 7; older servers get ``BLPOP`` and a take), and any id
        pushed after the disarm is returned by this wait or the next, as every id pushed after a
        scan's disarm is drained by that scan.

        A worker process's listener (``queues``: the worker queues it consumes) waits on those
        queues' lists, renewing each one's listening key first.
        """
        pipe = self._client.pipeline(transaction=False)
        if queues:
            for queue in queues:
                pipe.set(self.queue_listening_key(queue), b"1", px=LISTENING_TTL_MS)
            pipe.execute()
            return self._wait([self.queue_ids_key(q) for q in queues], count, block_s)
        pipe.delete(self.armed_key)
        pipe.set(self.listening_key, b"1", px=LISTENING_TTL_MS)
        pipe.execute()
        return self._wait([self.ids_key], count, block_s)

    def adopt(self, queues: Sequence[str]) -> int:
        """Move onto the driver's list the ids of any of these worker queues' lists that no worker
        listens to any more (its last listener died); how many moved. The driver's listener runs
        it at most once a second (``ADOPT_SCRIPT``)."""
        keys = [self.ids_key]
        for queue in queues:
            keys += [self.queue_ids_key(queue), self.queue_listening_key(queue)]
        return int(self._adopt(keys=keys))

    def _wait(self, lists: list[str], count: int, block_s: float) -> list[str]:
        """Block on ``lists`` until one holds ids, and take up to ``count`` of that one's."""
        from redis.exceptions import ResponseError

        if self._multi_pop:
            try:
                got = self._client.blmpop(block_s, len(lists), *lists, direction="LEFT", count=count)
            except ResponseError as exc:
                if "unknown command" not in str(exc).lower():
                    raise
                self._multi_pop = False  # a Redis before 7.0
            else:
                return _decoded(got[1]) if got else []
        first = self._client.blpop(lists, timeout=block_s)
        if first is None:
            return []
        more = _decoded(self._client.lpop(first[0], count - 1)) if count > 1 else []
        return _decoded([first[1]]) + more

    def stop_listening(self, queues: Sequence[str] = ()) -> list[str]:
        """A listener that stops on purpose withdraws its key, so pushes send messages again at once
        (with several listeners this may briefly send messages that one of them makes redundant).
        A worker's (``queues``) withdraws its queues' keys, so pushes go to the driver's list again,
        and answers the ids its queues' lists still hold, which the caller hands to the driver
        (another worker of one of those queues sets its key again before its next wait)."""
        if not queues:
            self._client.delete(self.listening_key)
            return []
        pipe = self._client.pipeline(transaction=True)
        pipe.delete(*[self.queue_listening_key(q) for q in queues])
        for queue in queues:
            pipe.lrange(self.queue_ids_key(queue), 0, -1)
        pipe.delete(*[self.queue_ids_key(q) for q in queues])
        answers = pipe.execute()
        return [job_id for raw in answers[1 : 1 + len(queues)] for job_id in _decoded(raw)]

    def disarm(self) -> None:
        self._client.delete(self.armed_key)

    def disarm_and_take(self, count: int) -> list[str]:
        """``disarm`` then ``take``, in one round trip (a scan's start)."""
        pipe = self._client.pipeline(transaction=True)
        pipe.delete(self.armed_key)
        pipe.lpop(self.ids_key, count)
        _, raw = pipe.execute()
        return _decoded(raw)

    def take(self, count: int, queues: Sequence[str] = ()) -> list[str]:
        """Up to ``count`` ids, oldest first, from the driver's list or (``queues``) from the first of
        those queues' lists that holds any (an empty list when drained)."""
        for key in [self.queue_ids_key(q) for q in queues] or [self.ids_key]:
            got = _decoded(self._client.lpop(key, count))
            if got:
                return got
        return []

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


def wake(
    send: Callable[[list[str]], None],
    wakes: WakeList | None,
    ids: Sequence[str],
    queues: Sequence[str | None] | None = None,
) -> None:
    """Wake the scanner for ``ids``: through the wake list when there is one (each to its worker
    queue's list while a worker listens there, ``queues`` naming each id's), else in the message.

    ``send(ids)`` publishes the wake-up message. When the list cannot be reached the ids travel
    in the message itself, as without Redis; when the message cannot be sent after arming, the
    key is dropped so the next enqueue arms (and sends) again, and the error propagates.
    """
    if not ids:
        return
    if wakes is not None:
        try:
            armed = wakes.push(ids, queues)
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
