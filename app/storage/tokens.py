"""API tokens, kept as receipt streams ``tokens/<id>`` with ``api_tokens`` as their projection.

Only a SHA-256 hash of each token is ever stored (tokens are 256-bit random, so a fast hash
is enough; there is nothing to brute-force). Revocation is a receipt, not a delete.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from sqlalchemy import delete, or_, select, update
from sqlalchemy.engine import Connection, Engine

from app.jobs.ids import new_id, new_token
from app.storage import store
from app.storage.db import api_tokens, parse_iso, transaction

TOKEN_STREAM_PREFIX = "tokens/"


@dataclass(frozen=True)
class TokenInfo:
    """Who a token speaks for."""

    id: str
    organization_id: str
    system: bool


def hash_token(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def create(engine: Engine, organization_id: str, *, system: bool = False) -> tuple[TokenInfo, str]:
    """Create a token; returns its info and the secret (shown once, never stored)."""
    if not organization_id.strip():
        raise ValueError("organization id must not be empty")
    secret = new_token()
    token_id = new_id("tok_")
    digest = hash_token(secret)
    with transaction(engine) as conn:
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
            },
        )
        conn.execute(
            api_tokens.insert().values(
                id=token_id,
                organization_id=organization_id,
                token_hash=digest,
                system=system,
                created_at=parse_iso(r.at),
            )
        )
    return TokenInfo(token_id, organization_id, system), secret


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
    return True


def authenticate(conn: Connection, secret: str) -> TokenInfo | None:
    """The live token matching ``secret``, or None."""
    row = conn.execute(
        select(api_tokens.c.id, api_tokens.c.organization_id, api_tokens.c.system).where(
            api_tokens.c.token_hash == hash_token(secret), api_tokens.c.revoked_at.is_(None)
        )
    ).first()
    return TokenInfo(row.id, row.organization_id, bool(row.system)) if row else None


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
                }
            elif r.type == "token.revoked" and values:
                values["revoked_at"] = parse_iso(r.at)
        if values:
            conn.execute(api_tokens.insert().values(**values))
            count += 1
    return count
