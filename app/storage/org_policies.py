"""Organisation dispatch policies set through the API, kept as receipt streams
``dispatch-policies/<organizationId>`` with ``org_dispatch_policies`` as their projection.

Each ``organization.dispatch_set`` receipt states the whole policy the API holds for the
organisation: ``weight`` and ``ratePerSecond``, either null (that field follows the settings,
``RECEIPT_ORG_WEIGHTS`` and ``RECEIPT_ORG_RATE_LIMITS``), and who set it. The row is the last
receipt's values; an organisation whose last receipt clears both has no row. Merging with the
settings is ``app.dispatch.policies``'s; this module only stores.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from sqlalchemy import delete, select
from sqlalchemy.engine import Connection, Engine

from app.storage import store
from app.storage.db import as_utc, org_dispatch_policies, parse_iso, transaction
from app.storage.retry import optimistic

STREAM_PREFIX: Final = "dispatch-policies/"
SET_EVENT: Final = "organization.dispatch_set"
WEIGHT_FIELD: Final = "weight"
RATE_FIELD: Final = "ratePerSecond"


def policy_stream(organization_id: str) -> str:
    return f"{STREAM_PREFIX}{organization_id}"


@dataclass(frozen=True)
class StoredPolicy:
    """What the API set for one organisation (None: that field follows the settings)."""

    organization_id: str
    weight: float | None
    rate_per_s: float | None
    updated_at: datetime | None = None

    @property
    def empty(self) -> bool:
        return self.weight is None and self.rate_per_s is None


def _row(row: Any) -> StoredPolicy:
    return StoredPolicy(row.organization_id, row.weight, row.rate_per_s, as_utc(row.updated_at))


def get(conn: Connection, organization_id: str) -> StoredPolicy | None:
    row = conn.execute(
        select(org_dispatch_policies).where(org_dispatch_policies.c.organization_id == organization_id)
    ).first()
    return _row(row) if row is not None else None


def list_all(conn: Connection) -> list[StoredPolicy]:
    """Every organisation's stored policy, by organisation (the dispatch pass reads this)."""
    rows = conn.execute(select(org_dispatch_policies).order_by(org_dispatch_policies.c.organization_id))
    return [_row(row) for row in rows]


def set_policy(
    engine: Engine,
    organization_id: str,
    weight: float | None,
    rate_per_s: float | None,
    *,
    by: Mapping[str, Any] | None = None,
) -> tuple[StoredPolicy, bool]:
    """Set the organisation's policy (either field None: it follows the settings): one receipt and
    its projection row in one transaction. The policy it holds after, and whether anything was
    written: the same policy again writes nothing."""

    def attempt() -> tuple[StoredPolicy, bool]:
        with transaction(engine) as conn:
            stream = policy_stream(organization_id)
            head = store.head(conn, stream)
            current = get(conn, organization_id)
            held = (current.weight, current.rate_per_s) if current is not None else (None, None)
            if held == (weight, rate_per_s):
                updated = parse_iso(head.at) if head is not None else None
                return current or StoredPolicy(organization_id, None, None, updated), False
            body: dict[str, Any] = {
                "organizationId": organization_id,
                WEIGHT_FIELD: weight,
                RATE_FIELD: rate_per_s,
            }
            if by is not None:
                body["by"] = dict(by)
            receipt = store.append(
                conn,
                stream,
                head.seq if head else 0,
                SET_EVENT,
                body,
                prev_hash=head.hash if head else None,
            )
            policy = _folded(organization_id, [receipt])
            assert policy is not None
            _save(conn, policy, receipt.seq)
            return policy, True

    return optimistic(attempt, what=f"dispatch policy of {organization_id}")


def _folded(organization_id: str, receipts: Sequence[store.StoredReceipt]) -> StoredPolicy | None:
    """The policy the last ``organization.dispatch_set`` of a stream states (None: none yet)."""
    last = next((r for r in reversed(receipts) if r.type == SET_EVENT), None)
    if last is None:
        return None
    return StoredPolicy(
        organization_id,
        _number(last.body.get(WEIGHT_FIELD)),
        _number(last.body.get(RATE_FIELD)),
        parse_iso(last.at),
    )


def _number(value: Any) -> float | None:
    """A receipt's number as stored (a hand-written receipt of another shape folds to unset)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def _save(conn: Connection, policy: StoredPolicy, seq: int) -> None:
    conn.execute(
        delete(org_dispatch_policies).where(org_dispatch_policies.c.organization_id == policy.organization_id)
    )
    if policy.empty:
        return  # nothing set through the API: the settings decide both fields
    conn.execute(
        org_dispatch_policies.insert().values(
            organization_id=policy.organization_id,
            weight=policy.weight,
            rate_per_s=policy.rate_per_s,
            last_seq=seq,
            updated_at=policy.updated_at,
        )
    )


def rebuild(conn: Connection) -> int:
    """Recreate ``org_dispatch_policies`` from the ``dispatch-policies/`` streams; the rows written."""
    conn.execute(delete(org_dispatch_policies))
    count = 0
    for stream in store.streams(conn, STREAM_PREFIX):
        receipts = store.read_stream(conn, stream)
        policy = _folded(stream[len(STREAM_PREFIX) :], receipts)
        if policy is not None and not policy.empty:
            _save(conn, policy, receipts[-1].seq)
            count += 1
    return count
