"""Each organisation's dispatch policy: its weight in the fair share and its rate limit.

Read by every dispatch pass (``org_policies``); an organisation without one gets ``DEFAULT``. Each
field comes from the API when set there (``PUT /organizations/{id}/dispatch``, stored by
``app.storage.org_policies``), else from the settings (``RECEIPT_ORG_WEIGHTS``,
``RECEIPT_ORG_RATE_LIMITS``), else the default: weight 1, no rate limit.

A pass runs on every wake of every worker group, so the merged map is kept per process for
``CACHE_SECONDS``: a policy set through the API reaches every process within that, and the process
that set it at once (``forget_cached``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal

from sqlalchemy.engine import Connection

from app.config import Settings
from app.storage import org_policies as stored_policies
from app.storage.org_policies import StoredPolicy

CACHE_SECONDS: Final = 1.0
# What the cache's age is measured by (a test moves it by hand).
clock: Callable[[], float] = time.monotonic


@dataclass(frozen=True)
class OrgPolicy:
    # The organisation's share of a worker group's free places relative to others (1: equal).
    weight: float = 1.0
    # At most this many dispatches per second across every process (None: no limit).
    rate_per_s: float | None = None


DEFAULT: Final = OrgPolicy()

# Where a field of an organisation's policy comes from.
Source = Literal["api", "setting", "default"]


@dataclass(frozen=True)
class Effective:
    """One organisation's policy as the pass applies it, and where each field comes from."""

    organization_id: str
    policy: OrgPolicy
    weight_from: Source
    rate_from: Source
    # What the API holds for it (None: nothing), and what the settings say (None: not listed).
    stored: StoredPolicy | None
    setting_weight: float | None
    setting_rate_per_s: float | None


def effective(settings: Settings, stored: StoredPolicy | None, organization_id: str) -> Effective:
    """``organization_id``'s policy: per field, the API's value, else the setting's, else the default."""
    setting_weight = dict(settings.org_weights).get(organization_id)
    setting_rate = dict(settings.org_rate_limits).get(organization_id)
    api_weight = stored.weight if stored is not None else None
    api_rate = stored.rate_per_s if stored is not None else None
    weight: float = DEFAULT.weight
    weight_from: Source = "default"
    if api_weight is not None:
        weight, weight_from = api_weight, "api"
    elif setting_weight is not None:
        weight, weight_from = setting_weight, "setting"
    rate: float | None = DEFAULT.rate_per_s
    rate_from: Source = "default"
    if api_rate is not None:
        rate, rate_from = api_rate, "api"
    elif setting_rate is not None:
        rate, rate_from = setting_rate, "setting"
    return Effective(
        organization_id, OrgPolicy(weight, rate), weight_from, rate_from, stored, setting_weight, setting_rate
    )


def every_effective(settings: Settings, stored: Iterable[StoredPolicy]) -> list[Effective]:
    """The policy of every organisation the settings list or the API holds one for, by organisation."""
    by_org = {policy.organization_id: policy for policy in stored}
    named = (
        set(by_org) | {org for org, _ in settings.org_weights} | {org for org, _ in settings.org_rate_limits}
    )
    return [effective(settings, by_org.get(org), org) for org in sorted(named)]


def merged(settings: Settings, stored: Iterable[StoredPolicy]) -> dict[str, OrgPolicy]:
    """The organisations whose policy is not ``DEFAULT``, with their policy."""
    return {e.organization_id: e.policy for e in every_effective(settings, stored) if e.policy != DEFAULT}


_lock = threading.Lock()
_cached: dict[tuple[object, ...], tuple[float, Mapping[str, OrgPolicy]]] = {}


def org_policies(conn: Connection, settings: Settings) -> Mapping[str, OrgPolicy]:
    """The organisations whose policy is not ``DEFAULT`` (read at most every ``CACHE_SECONDS`` per
    database and settings in this process)."""
    key = (str(conn.engine.url), settings.org_weights, settings.org_rate_limits)
    now = clock()
    with _lock:
        hit = _cached.get(key)
    if hit is not None and hit[0] > now:
        return hit[1]
    policies = MappingProxyType(merged(settings, stored_policies.list_all(conn)))
    with _lock:
        _cached[key] = (now + CACHE_SECONDS, policies)
    return policies


def forget_cached() -> None:
    """Drop this process's cached policies (after this process set one: its next pass reads it)."""
    with _lock:
        _cached.clear()
