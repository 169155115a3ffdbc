"""Each organisation's dispatch policy: its weight in the fair share and its rate limit.

Read by every dispatch pass (``org_policies``); an organisation without one gets ``DEFAULT``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from sqlalchemy.engine import Connection

from app.config import Settings


@dataclass(frozen=True)
class OrgPolicy:
    # The organisation's share of a worker group's free places relative to others (1: equal).
    weight: float = 1.0
    # At most this many dispatches per second across every process (None: no limit).
    rate_per_s: float | None = None


DEFAULT: Final = OrgPolicy()


def org_policies(conn: Connection, settings: Settings) -> Mapping[str, OrgPolicy]:
    """The organisations whose policy is not ``DEFAULT`` (none yet: every organisation weighs 1)."""
    return {}
