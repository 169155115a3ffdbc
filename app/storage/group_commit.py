"""Group commit: a process's concurrent job transitions share one transaction and one commit.

A worker runs many attempts at once, and each writes a heartbeat, progress or a settlement now and
then. Alone, each is its own round trips and its own commit (a WAL flush). Here the writes that
arrive while commits are in flight wait, and the next commit carries them all: the
leader/follower scheme of PostgreSQL's own group commit and of River's batch completer.

- **Adaptive.** A write that finds a commit slot free (``COMMITS_IN_FLIGHT``) is committed at
  once, alone, exactly as without this module (one statement on PostgreSQL), so an idle process's
  latency does not grow. Under load the batches grow by themselves: a batch is whatever queued
  while the slots were busy, up to ``max_items``.
- **The leader is a caller.** No thread of its own: a caller that finds a free slot takes the
  queued writes (its own first) and commits them in its thread; the others wait for their answer,
  and one of those still queued leads the next commit. Nothing to start or stop.
- **Every write keeps its own fence and receipts.** ``Queue.mutate_many`` decides each write on its
  own job as read, appends its own hash-chained receipts to its own stream, and answers each apart.
- **A failed commit settles nobody.** The transaction rolls back whole: every write of the batch
  gets the error unless it is then committed alone. A failure of the moment (the database down, a
  deadlock) is every write's, and each caller retries as it would have; any other failure may be one
  write's, so each write of the batch is tried again alone, and only the one that fails reports it.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from app.storage.retry import is_transient

if TYPE_CHECKING:
    from app.storage.queue import Decide, Outcome, Queue


# Two commits may run at once, each on its own connection. With one, every write of the process
# queued behind a single leader's round trips: on 2 cores (bench/group_commit_bench.py) that
# cost 9 % of the transitions per second and added ~25 ms to the loaded p50 end to end, while two
# keep the database busy on both connections and still cut the commits by more than half.
COMMITS_IN_FLIGHT = 2


class GroupCommitAbandoned(RuntimeError):
    """The commit carrying this write never finished (its leader's thread was interrupted)."""


@dataclass
class _Write:
    job_id: str
    decide: Decide
    outcome: Outcome | None = None
    error: BaseException | None = None
    taken: bool = False  # in a commit's batch
    done: bool = False

    def answer(self) -> Outcome:
        if self.error is not None:
            raise self.error
        assert self.outcome is not None
        return self.outcome


class GroupCommit:
    """Coalesces one process's concurrent ``Queue.mutate`` calls into shared commits."""

    def __init__(
        self,
        queue: Queue,
        max_items: int,
        observe: Callable[[int], None] | None = None,
        *,
        in_flight: int = COMMITS_IN_FLIGHT,
    ) -> None:
        """``observe`` is told how many writes each commit carried (metrics); ``in_flight`` commits
        may run at once."""
        if max_items < 2 or in_flight < 1:
            raise ValueError(
                f"group commit needs max_items >= 2 and in_flight >= 1, got {max_items}, {in_flight}"
            )
        self.slots = in_flight  # commits that may run at once
        self._queue = queue
        self.max_items = max_items
        self._observe = observe
        self._cond = threading.Condition()
        self._pending: deque[_Write] = deque()
        self._in_flight = 0  # commits running now
        self._leading = threading.local()
        # Read by tests and the bench: how many commits, and how many writes they carried.
        self.commits = 0
        self.writes = 0
        self.largest = 0

    def mutate(self, job_id: str, decide: Decide) -> Outcome:
        if getattr(self._leading, "active", False):
            # An after-commit effect of the batch this thread leads writes again: it cannot wait
            # for the commit it is itself finishing.
            return self._queue.mutate_alone(job_id, decide)
        write = _Write(job_id, decide)
        with self._cond:
            self._pending.append(write)
            while (write.taken or self._in_flight >= self.slots) and not write.done:
                self._cond.wait()
            if write.done:
                return write.answer()
            self._in_flight += 1
            batch = self._take(write)
        self._leading.active = True
        try:
            self._commit(batch)
        finally:
            self._leading.active = False
            with self._cond:
                for each in batch:
                    if not each.done:
                        each.error = GroupCommitAbandoned(f"the commit carrying {each.job_id} did not finish")
                        each.done = True
                self._in_flight -= 1
                self._cond.notify_all()
        return write.answer()

    def _take(self, own: _Write) -> list[_Write]:
        """The leader's own write first, then the oldest queued, ``max_items`` in all."""
        self._pending.remove(own)
        batch = [own]
        while self._pending and len(batch) < self.max_items:
            batch.append(self._pending.popleft())
        for write in batch:
            write.taken = True
        self.commits += 1
        self.writes += len(batch)
        self.largest = max(self.largest, len(batch))
        return batch

    def _commit(self, batch: list[_Write]) -> None:
        if self._observe is not None:
            self._observe(len(batch))
        if len(batch) == 1:
            self._alone(batch[0])
            return
        try:
            answers = self._queue.mutate_many([(w.job_id, w.decide) for w in batch])
        except Exception as exc:
            if is_transient(exc):
                self._finish(batch, [exc] * len(batch))
                return
            for write in batch:  # find the write that fails; the others commit
                self._alone(write)
            return
        self._finish(batch, answers)

    def _alone(self, write: _Write) -> None:
        try:
            answer: Outcome | Exception = self._queue.mutate_alone(write.job_id, write.decide)
        except Exception as exc:
            answer = exc
        self._finish([write], [answer])

    def _finish(self, batch: list[_Write], answers: list[Outcome | Exception]) -> None:
        with self._cond:
            for write, answer in zip(batch, answers, strict=True):
                if isinstance(answer, Exception):
                    write.error = answer
                else:
                    write.outcome = answer
                write.done = True
            self._cond.notify_all()
