"""The lease's word on concurrency keys: an attempt starts only while its key has a free slot.

Counted from leases (the jobs of the organisation's key that are ``leased`` or ``running``), under an
advisory lock per key held to the lease's commit, so two processes leasing one key at once see each
other. The dispatch pass never sends a key past its limit; this is what holds when something else
sends (a redrive, a duplicate message, a pass that read before a lease committed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final, Literal

from sqlalchemy import func, select, tuple_
from sqlalchemy.engine import Connection

from app.jobs.flow import FALLBACK_CONCURRENCY_LIMIT
from app.jobs.reducer import Job
from app.jobs.vocab import LEASED_STATUSES
from app.storage.db import is_sqlite, jobs, lock_keys

# What a start answers when the job's key is full: nothing was written, the job stays queued.
KeyFull = Literal["concurrency_limited"]
KEY_FULL: Final[KeyFull] = "concurrency_limited"


def own_limit(job: Job) -> int:
    """The job's own limit, else one at a time (the operator's prefixes are ``app.dispatch.limits``)."""
    return job.flow.concurrency_limit or FALLBACK_CONCURRENCY_LIMIT


def key_of(job: Job) -> tuple[str, str] | None:
    key = job.flow.concurrency_key
    return (job.organization_id or "", key) if key is not None else None


def _keyed(starting: Sequence[Job]) -> list[tuple[Job, tuple[str, str]]]:
    return [(job, k) for job in starting if job.status == "queued" and (k := key_of(job)) is not None]


def locks_for(starting: Sequence[Job]) -> bool:
    """Whether ``refused`` takes a lock (and reads) for these jobs: one of them is a queued job with
    a concurrency key. Without, it answers at once, and a lease needs no transaction for it."""
    return bool(_keyed(starting))


def refused(conn: Connection, starting: Sequence[Job], limit_of: Callable[[Job], int]) -> set[str]:
    """The ids among ``starting`` (queued jobs about to be leased, in order) whose key is full."""
    keyed = _keyed(starting)
    if not keyed:
        return set()
    pairs = sorted({k for _, k in keyed})
    lock_keys(conn, [f"concurrency:{org}\x1f{key}" for org, key in pairs])
    j = jobs.c
    org = func.coalesce(j.organization_id, "")
    where = [j.status.in_(sorted(LEASED_STATUSES)), j.concurrency_key.in_(sorted({k for _, k in pairs}))]
    if not is_sqlite(conn) or len(pairs) == 1:
        where.append(tuple_(org, j.concurrency_key).in_(pairs))
    held = {
        (r[0], r[1]): r[2]
        for r in conn.execute(
            select(org, j.concurrency_key, func.count()).where(*where).group_by(org, j.concurrency_key)
        )
    }
    out: set[str] = set()
    for job, k in keyed:
        if held.get(k, 0) >= limit_of(job):
            out.add(job.id)
        else:
            held[k] = held.get(k, 0) + 1
    return out
