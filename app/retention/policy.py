"""Which finished work may leave the database: the retention policy, as pure functions.

A job is eligible once it is terminal and ended longer ago than its organisation's window, and it
belongs to no objective still in the database (an objective's jobs leave with it, never before).
An objective is eligible once it is terminal and ended longer ago than the window, and so is every
job it owns (tasks, control, audit and monitor jobs): an objective whose audit job still waits keeps
everything. A window of 0 days keeps an organisation's history for ever.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from app.config import Settings
from app.jobs.ids import SYSTEM_ORGANIZATION
from app.jobs.vocab import TERMINAL_STATUSES

# An objective's statuses that end it (the Factory's vocabulary says the same; a test compares).
TERMINAL_OBJECTIVE_STATUSES = frozenset({"completed", "failed", "canceled"})


@dataclass(frozen=True)
class Policy:
    """The retention window in days: ``days`` for every organisation, unless ``by_organization``
    names it. 0 keeps everything."""

    days: int = 0
    by_organization: Mapping[str, int] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: Settings) -> Policy:
        return cls(settings.retention_days, dict(settings.retention_days_by_organization))

    def window_days(self, organization_id: str | None) -> int:
        org = organization_id or SYSTEM_ORGANIZATION
        return self.by_organization.get(org, self.days)

    def cutoff(self, organization_id: str | None, now: datetime) -> datetime | None:
        """Streams of this organisation that ended before this may go; None: none ever does."""
        days = self.window_days(organization_id)
        return None if days <= 0 else now - timedelta(days=days)

    @property
    def enabled(self) -> bool:
        return self.days > 0 or any(d > 0 for d in self.by_organization.values())

    def windows(self) -> list[tuple[int, tuple[str, ...] | None, tuple[str, ...]]]:
        """The distinct positive windows, each with the organisations it names (None: every
        organisation not overridden) and the organisations it leaves out: what a selection
        query filters on."""
        overridden = tuple(sorted(self.by_organization))
        out: list[tuple[int, tuple[str, ...] | None, tuple[str, ...]]] = []
        if self.days > 0:
            out.append((self.days, None, overridden))
        by_days: dict[int, list[str]] = {}
        for org, days in self.by_organization.items():
            if days > 0:
                by_days.setdefault(days, []).append(org)
        for days, orgs in sorted(by_days.items()):
            out.append((days, tuple(sorted(orgs)), ()))
        return out


@dataclass(frozen=True)
class Ended:
    """What eligibility needs of a job or an objective: its organisation, status, and when its
    status last changed (for a terminal one: when it ended)."""

    organization_id: str | None
    status: str
    changed_at: datetime


def _old(policy: Policy, item: Ended, now: datetime) -> bool:
    cutoff = policy.cutoff(item.organization_id, now)
    return cutoff is not None and item.changed_at < cutoff


def job_eligible(policy: Policy, job: Ended, now: datetime, *, in_live_objective: bool) -> bool:
    """A job on its own: terminal, older than its window, and owned by no objective still live
    (``in_live_objective``: an objective in the database names it, by its key or its payload)."""
    return job.status in TERMINAL_STATUSES and not in_live_objective and _old(policy, job, now)


def objective_eligible(policy: Policy, objective: Ended, jobs: Iterable[Ended], now: datetime) -> bool:
    """An objective with every job it owns: all terminal and older than the objective's window."""
    if objective.status not in TERMINAL_OBJECTIVE_STATUSES or not _old(policy, objective, now):
        return False
    return all(j.status in TERMINAL_STATUSES and _old(policy, j, now) for j in jobs)


def owning_objectives(job_key: str) -> Sequence[str]:
    """The objective keys a job key could belong to: every prefix before a ``:`` (an objective's
    jobs are keyed ``<objectiveKey>:p<phase>:<task>``, ``<objectiveKey>:control:<n>``,
    ``<objectiveKey>:audit``, and a task's monitor ``<taskJobKey>:monitor``)."""
    out = []
    at = job_key.find(":")
    while at > 0:
        out.append(job_key[:at])
        at = job_key.find(":", at + 1)
    return out
