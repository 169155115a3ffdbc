"""Claiming a woken job at once, without a pass, while its queue has room and no line.

A pass chooses between organisations when places are scarce. When the queue's last pass in this
process found places to spare and left no job waiting, a job that just became ready has nobody to
be fair to: the process claims it directly (the claim a pass would end with), and saves the pass's
lock, counts and heads on the path of every idle job. The room is the places that pass left free,
minus what this process has claimed directly since; it lapses after ``WINDOW_S`` or with the next
pass. Only a job the pass would send without a second thought qualifies: ready now, no
concurrency key (keys are counted by passes), no organisation rate limit (limiters are spent by
passes). Several driver processes may each spend the same room once, so a queue can briefly hold up
to that many extra attempts in its broker queue; with no line waiting nobody is behind them.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from datetime import datetime

from app.dispatch import policies
from app.dispatch.line import PassResult
from app.jobs.reducer import Job
from app.storage.db import parse_iso

# How long a pass's view of the room is trusted.
WINDOW_S = 1.0


def room(result: PassResult | None, ran_at: float, now: float, spent: int) -> int:
    """Places this process may still claim directly in the queue of ``result`` (its last pass)."""
    if result is None or now - ran_at > WINDOW_S or result.line_waiting:
        return 0
    return max(0, result.places - len(result.claimed) - spent)


def qualifies(job: Job, now: datetime, org_policy: Mapping[str, policies.OrgPolicy]) -> bool:
    if job.status != "queued" or job.flow.concurrency_key is not None:
        return False
    at = parse_iso(job.available_at)
    if at is not None and at > now:
        return False
    return org_policy.get(job.organization_id or "", policies.DEFAULT).rate_per_s is None


def pick(jobs: Sequence[Job], places: int) -> list[Job]:
    """The first ``places`` of ``jobs`` in line order (priority, then age), as a pass would take them."""
    ranked = sorted(jobs, key=lambda j: (-j.flow.priority, j.updated_at or "", j.id))
    return ranked[:places]


class Rooms:
    """What this process has claimed directly per queue since that queue's last pass."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spent: dict[str, int] = {}

    def reset(self, queue: str) -> None:
        """A pass ran: its own view of the room replaces what was spent before it."""
        with self._lock:
            self._spent[queue] = 0

    def any_room(self, passes: Mapping[str, tuple[float, PassResult]], now: float) -> bool:
        """Whether any queue has room left (a woken job's queue is known only once it is read)."""
        with self._lock:
            return any(
                room(result, ran_at, now, self._spent.get(queue, 0)) > 0
                for queue, (ran_at, result) in list(passes.items())
            )

    def take(self, queue: str, last: tuple[float, PassResult] | None, now: float, wanted: int) -> int:
        """Reserve up to ``wanted`` places of ``queue``'s room; how many were reserved."""
        ran_at, result = last if last is not None else (0.0, None)
        with self._lock:
            spent = self._spent.get(queue, 0)
            n = min(wanted, room(result, ran_at, now, spent))
            self._spent[queue] = spent + n
            return n
