"""The dispatch choice as a pure function: which queued attempts fill a worker group's free places.

Inputs are what one pass read in its transaction (``app/dispatch/line.py``): the head of each
organisation's waiting line, how many places are free, what is in flight per organisation and per
concurrency key, each organisation's weight, and what the rate limiters allow right now. Output is
the attempts to send, in order, and for every head left behind the reason it waits.

The rules (docs/dispatch.md):

* **Fair share, max-min, in turns.** Each place goes to the organisation with the fewest attempts in
  flight per unit of weight; ties go to the organisation whose last turn is oldest (never served
  first), then to the one whose next attempt has waited longest. An organisation with nothing in
  flight therefore gets one of the next places, however old another's backlog is, and one
  organisation's backlog delays another's next job by about one job per place, never by the backlog.
* **Priority orders a line, never crosses lines**: each organisation's line is given in its own order
  (priority, then age); a high priority does not move its organisation ahead of another.
* **A concurrency key** never has more than its limit in flight: a head whose key is full waits
  (``concurrency``) and the organisation's next head is considered instead.
* **A rate limiter** (the organisation's, or its key's) admits at most its allowance in one pass; a
  head with none waits (``rate``).
* Everything else left behind waits for a place (``share``).
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

WaitingReason = Literal["concurrency", "rate", "share"]
WAITING_REASONS: Final[tuple[WaitingReason, ...]] = ("concurrency", "rate", "share")


@dataclass(frozen=True)
class Candidate:
    """One queued attempt at the head of its organisation's line."""

    job_id: str
    org: str
    # Seconds since the epoch when it joined the line: the tie-break between organisations.
    since: float
    # Its concurrency key (scoped to ``org`` by the caller) and that key's limit.
    key: str | None = None
    limit: int | None = None
    # The rate limiter that governs its key, if any (``allowance`` names it).
    key_limiter: str | None = None


@dataclass(frozen=True)
class Line:
    """What one pass knows about one worker group."""

    places: int
    # Each organisation's heads, in the order its line runs them.
    heads: Mapping[str, Sequence[Candidate]]
    in_flight: Mapping[str, int] = field(default_factory=dict)
    # In flight per (organisation, key).
    key_in_flight: Mapping[tuple[str, str], int] = field(default_factory=dict)
    # Weight per organisation (missing: 1).
    weights: Mapping[str, float] = field(default_factory=dict)
    # Dispatches each limiter admits now (a limiter missing here admits any number).
    allowance: Mapping[str, int] = field(default_factory=dict)
    # The limiter of each organisation that has one.
    org_limiter: Mapping[str, str] = field(default_factory=dict)
    # When each organisation last got a place in this group (seconds; missing: never).
    last_turn: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Waiting:
    reason: WaitingReason
    key: str | None = None


@dataclass(frozen=True)
class Choice:
    send: tuple[Candidate, ...]
    waiting: Mapping[str, Waiting]
    # How many dispatches each limiter spent.
    spent: Mapping[str, int]


def choose(line: Line) -> Choice:
    """Fill ``line.places`` from the heads; see the module's rules."""
    served = {org: line.in_flight.get(org, 0) for org in line.heads}
    keys = dict(line.key_in_flight)
    allowance = dict(line.allowance)
    position = dict.fromkeys(line.heads, 0)
    waiting: dict[str, Waiting] = {}
    send: list[Candidate] = []
    spent: dict[str, int] = {}

    turns = {org: line.last_turn.get(org, float("-inf")) for org in line.heads}
    # Turns given in this pass come after every recorded one, in the order they were given.
    latest = max(turns.values(), default=0.0)
    latest = latest if latest != float("-inf") else 0.0

    def rank(org: str) -> tuple[float, float, float, str]:
        heads = line.heads[org]
        at = position[org]
        since = heads[at].since if at < len(heads) else float("inf")
        return (served[org] / max(line.weights.get(org, 1.0), 1e-9), turns[org], since, org)

    queue = [rank(org) for org, heads in line.heads.items() if heads]
    heapq.heapify(queue)
    places = line.places
    while places > 0 and queue:
        org = heapq.heappop(queue)[-1]
        heads = line.heads[org]
        org_limiter = line.org_limiter.get(org)
        if org_limiter is not None and allowance.get(org_limiter, 1) <= 0:
            for c in heads[position[org] :]:
                waiting.setdefault(c.job_id, Waiting("rate", None))
            position[org] = len(heads)
            continue
        taken: Candidate | None = None
        while position[org] < len(heads):
            c = heads[position[org]]
            position[org] += 1
            if c.key is not None and keys.get((org, c.key), 0) >= (c.limit or 1):
                waiting[c.job_id] = Waiting("concurrency", c.key)
                continue
            if c.key_limiter is not None and allowance.get(c.key_limiter, 1) <= 0:
                waiting[c.job_id] = Waiting("rate", c.key)
                continue
            taken = c
            break
        if taken is None:
            continue
        send.append(taken)
        places -= 1
        served[org] += 1
        latest += 1.0
        turns[org] = latest
        if taken.key is not None:
            keys[(org, taken.key)] = keys.get((org, taken.key), 0) + 1
        for limiter in (taken.key_limiter, org_limiter):
            if limiter is not None:
                spent[limiter] = spent.get(limiter, 0) + 1
                if limiter in allowance:
                    allowance[limiter] -= 1
        if position[org] < len(heads):
            heapq.heappush(queue, rank(org))
    chosen = {c.job_id for c in send}
    for heads in line.heads.values():
        for c in heads:
            if c.job_id not in chosen:
                waiting.setdefault(c.job_id, Waiting("share"))
    return Choice(tuple(send), waiting, spent)
