"""API tokens, kept as receipt streams ``tokens/<id>`` with ``api_tokens`` as their projection.

Only a SHA-256 hash of each token is ever stored (tokens are 256-bit random, so a fast hash
is enough; there is nothing to brute-force). Revocation is a receipt, not a delete.

A token carries scopes (``commands``: may post jobs that run a command) and an optional expiry,
both fixed at creation and written on ``token.created``; an expired token authenticates nobody.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple

from sqlalchemy import bindparam, delete, or_, select, update
from sqlalchemy.engine import Connection, Engine

from app.jobs.ids import ORGANIZATION_ID_PATTERN, ORGANIZATION_ID_RULE, new_id, new_token
from app.jobs.privilege import parse_scopes
from app.storage import store
from app.storage.db import api_tokens, as_utc, db_now, iso, parse_iso, transaction
from app.storage.direct import Direct

TOKEN_STREAM_PREFIX = "tokens/"


@dataclass(frozen=True)
class TokenInfo:
    """Who a token speaks for."""

    id: str
    organization_id: str
    system: bool
    scopes: tuple[str, ...] = ()
    expires_at: datetime | None = None
    created_at: datetime | None = None
    revoked_at: datetime | None = None

    def expired(self, now: datetime) -> bool:
        return self.expires_at is not None and self.expires_at <= now

    def to_json(self) -> dict[str, object]:
        """The listing form: everything but the secret (which is never stored anyway)."""
        return {
            "id": self.id,
            "organizationId": self.organization_id,
            "system": self.system,
            "scopes": list(self.scopes),
            "createdAt": iso(self.created_at),
            "expiresAt": iso(self.expires_at),
            "revokedAt": iso(self.revoked_at),
        }


def _scopes_column(scopes: tuple[str, ...]) -> str | None:
    return " ".join(scopes) or None


def _info(row: Any) -> TokenInfo:
    def when(value: datetime | None) -> datetime | None:
        return as_utc(value) if value is not None else None

    return TokenInfo(
        id=row.id,
        organization_id=row.organization_id,
        system=bool(row.system),
        scopes=tuple((row.scopes or "").split()),
        expires_at=when(row.expires_at),
        created_at=when(row.created_at),
        revoked_at=when(row.revoked_at),
    )


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create(
    engine: Engine,
    organization_id: str,
    *,
    system: bool = False,
    scopes: Iterable[str] = (),
    expires_in: timedelta | None = None,
) -> tuple[TokenInfo, str]:
    """Create a token; returns its info and the secret (shown once, never stored).

    ``scopes`` must come from ``TOKEN_SCOPES``; ``expires_in`` counts from now (database clock).
    """
    if not ORGANIZATION_ID_PATTERN.fullmatch(organization_id):
        # Also keeps every token out of the system's own organisation (SYSTEM_ORGANIZATION).
        raise ValueError(f"organization id {organization_id!r} {ORGANIZATION_ID_RULE}")
    scope_set = parse_scopes(scopes)
    if expires_in is not None and expires_in <= timedelta(0):
        raise ValueError("expiry must be in the future")
    secret = new_token()
    token_id = new_id("tok_")
    digest = hash_token(secret)
    with transaction(engine) as conn:
        expires_at = db_now(conn) + expires_in if expires_in is not None else None
        r = store.append(
            conn,
            TOKEN_STREAM_PREFIX + token_id,
            0,
            "token.created",
            {
                "tokenId": token_id,
                "organizationId": organization_id,
                "system": system,
                "tokenHash": digest,
                "scopes": list(scope_set),
                "expiresAt": iso(expires_at),
            },
        )
        created_at = parse_iso(r.at)
        conn.execute(
            api_tokens.insert().values(
                id=token_id,
                organization_id=organization_id,
                token_hash=digest,
                system=system,
                created_at=created_at,
                scopes=_scopes_column(scope_set),
                expires_at=expires_at,
            )
        )
    return TokenInfo(token_id, organization_id, system, scope_set, expires_at, created_at), secret


# Revocations this process made: an API process's token cache (api/token_cache.py) empties when
# the count moves, so a revocation made here is seen at once; one made elsewhere within its TTL.
_revoked_here = [0]


def revocations() -> int:
    """How many tokens this process has revoked so far."""
    return _revoked_here[0]


def revoke(engine: Engine, token: str) -> bool:
    """Revoke by token id or by the secret itself. False if no such live token."""
    with transaction(engine) as conn:
        row = conn.execute(
            select(api_tokens.c.id).where(
                or_(api_tokens.c.id == token, api_tokens.c.token_hash == hash_token(token)),
                api_tokens.c.revoked_at.is_(None),
            )
        ).first()
        if row is None:
            return False
        stream = TOKEN_STREAM_PREFIX + row.id
        last = store.head(conn, stream)
        r = store.append(
            conn,
            stream,
            last.seq if last else 0,
            "token.revoked",
            {"tokenId": row.id},
            prev_hash=last.hash if last else None,
        )
        conn.execute(update(api_tokens).where(api_tokens.c.id == row.id).values(revoked_at=parse_iso(r.at)))
    _revoked_here[0] += 1
    return True


# Built once: every authenticated API request runs it, and building the statement (and its cache
# key) each time cost as much CPU as executing it.
# On PostgreSQL it runs on the driver's cursor (app/storage/direct.py).
class _Found(NamedTuple):
    id: str
    organization_id: str | None
    system: bool
    scopes: str | None
    expires_at: datetime | None
    created_at: datetime | None
    revoked_at: datetime | None


_LOOKUP = Direct(
    select(*(api_tokens.c[name] for name in _Found._fields)).where(
        api_tokens.c.token_hash == bindparam("token_hash"), api_tokens.c.revoked_at.is_(None)
    )
)


def lookup(conn: Connection, secret: str) -> TokenInfo | None:
    """The unrevoked token matching ``secret`` (expired or not), or None."""
    rows = _LOOKUP.rows(conn, {"token_hash": hash_token(secret)})
    return _info(_Found(*rows[0])) if rows else None


def authenticate(conn: Connection, secret: str, now: datetime | None = None) -> TokenInfo | None:
    """The live (unrevoked, unexpired) token matching ``secret``, or None."""
    info = lookup(conn, secret)
    if info is None or info.expired(now or datetime.now(UTC)):
        return None
    return info


def is_live(conn: Connection, token_id: str, now: datetime | None = None) -> bool:
    """Whether token ``token_id`` still authenticates (an open event stream asks on every poll)."""
    row = conn.execute(
        select(api_tokens.c.expires_at).where(api_tokens.c.id == token_id, api_tokens.c.revoked_at.is_(None))
    ).first()
    if row is None:
        return False
    return row.expires_at is None or as_utc(row.expires_at) > (now or datetime.now(UTC))


def list_all(conn: Connection) -> list[TokenInfo]:
    """Every token, oldest first (no secrets: only hashes are stored, and those are not returned)."""
    rows = conn.execute(select(api_tokens).order_by(api_tokens.c.created_at, api_tokens.c.id)).all()
    return [_info(r) for r in rows]


def rebuild(conn: Connection) -> int:
    """Recreate ``api_tokens`` from ``tokens/`` streams."""
    conn.execute(delete(api_tokens))
    count = 0
    for stream in store.streams(conn, TOKEN_STREAM_PREFIX):
        values: dict[str, object] = {}
        for r in store.read_stream(conn, stream):
            if r.type == "token.created":
                values = {
                    "id": r.body["tokenId"],
                    "organization_id": r.body["organizationId"],
                    "token_hash": r.body["tokenHash"],
                    "system": bool(r.body["system"]),
                    "created_at": parse_iso(r.at),
                    "revoked_at": None,
                    # Absent on tokens created before scopes existed: no scopes, no expiry.
                    "scopes": _scopes_column(tuple(r.body.get("scopes") or ())),
                    "expires_at": parse_iso(r.body.get("expiresAt")),
                }
            elif r.type == "token.revoked" and values:
                values["revoked_at"] = parse_iso(r.at)
        if values:
            conn.execute(api_tokens.insert().values(**values))
            count += 1
    return count
