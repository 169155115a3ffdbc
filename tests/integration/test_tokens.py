"""API tokens: receipt streams ``tokens/<id>`` with ``api_tokens`` as their projection."""

from __future__ import annotations

import hashlib
import json
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select, text
from sqlalchemy.engine import Engine

from app.storage import store, tokens
from app.storage.db import api_tokens, receipts, transaction


def everything_stored(engine: Engine) -> str:
    """Every receipt and every api_tokens row, as text: where a leaked secret would show up."""
    with engine.connect() as conn:
        rows = [r._asdict() for r in conn.execute(select(receipts))]
        rows += [r._asdict() for r in conn.execute(select(api_tokens))]
    return json.dumps(rows, default=str)


def token_rows(engine: Engine) -> list[tuple[Any, ...]]:
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(select(api_tokens).order_by(api_tokens.c.id))]


def test_tokens_are_stored_hashed_only(engine: Engine) -> None:
    info, secret = tokens.create(engine, "org-1")
    _other, other_secret = tokens.create(engine, "org-2", system=True)
    assert secret.startswith("rcpt_") and len(secret) > 40 and secret != other_secret
    stored = everything_stored(engine)
    for s in (secret, other_secret):
        assert s not in stored and s[len("rcpt_") :] not in stored
        assert hashlib.sha256(s.encode()).hexdigest() in stored  # what *is* stored is the hash
    with engine.connect() as conn:
        row = conn.execute(select(api_tokens).where(api_tokens.c.id == info.id)).one()
        [created] = store.read_stream(conn, f"tokens/{info.id}")
    assert row.token_hash == hashlib.sha256(secret.encode()).hexdigest()
    assert (row.organization_id, row.system, row.revoked_at) == ("org-1", False, None)
    assert created.type == "token.created" and created.body["tokenHash"] == row.token_hash
    assert created.body == {
        "tokenId": info.id,
        "organizationId": "org-1",
        "system": False,
        "tokenHash": row.token_hash,
        "scopes": [],
        "expiresAt": None,
    }


def test_authenticate(engine: Engine) -> None:
    info, secret = tokens.create(engine, "org-1")
    with engine.connect() as conn:
        assert tokens.authenticate(conn, secret) == info
        assert tokens.authenticate(conn, secret + "x") is None
        assert tokens.authenticate(conn, "") is None
        assert tokens.authenticate(conn, tokens.hash_token(secret)) is None  # the hash is not a credential


@pytest.mark.parametrize("by", ["id", "secret"])
def test_revoke_by_id_or_secret(engine: Engine, by: str) -> None:
    info, secret = tokens.create(engine, "org-1")
    keep, keep_secret = tokens.create(engine, "org-1")
    assert tokens.revoke(engine, info.id if by == "id" else secret)
    with engine.connect() as conn:
        assert tokens.authenticate(conn, secret) is None
        assert tokens.authenticate(conn, keep_secret) == keep  # only that token
        types = [r.type for r in store.read_stream(conn, f"tokens/{info.id}")]
        revoked_at = conn.execute(
            select(api_tokens.c.revoked_at).where(api_tokens.c.id == info.id)
        ).scalar_one()
    assert types == ["token.created", "token.revoked"] and revoked_at is not None
    # Revocation is a receipt, never a delete; a second revoke finds no live token and writes nothing.
    with engine.connect() as conn:
        before = conn.execute(select(func.count()).select_from(receipts)).scalar_one()
    assert not tokens.revoke(engine, info.id) and not tokens.revoke(engine, secret)
    assert not tokens.revoke(engine, "tok_unknown")
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(receipts)).scalar_one() == before
        assert store.verify(conn) == (before, None)


def test_create_rejects_an_empty_organization_and_writes_nothing(engine: Engine) -> None:
    with pytest.raises(ValueError):
        tokens.create(engine, "  ")
    assert token_rows(engine) == [] and everything_stored(engine) == "[]"


def test_rebuild_recreates_the_token_table_from_receipts(engine: Engine) -> None:
    live, live_secret = tokens.create(engine, "org-1")
    _dead, dead_secret = tokens.create(engine, "org-2", system=True)
    tokens.revoke(engine, dead_secret)
    before = token_rows(engine)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM api_tokens"))
    assert token_rows(engine) == []
    with transaction(engine) as conn:
        assert tokens.rebuild(conn) == 2
    assert token_rows(engine) == before
    with engine.connect() as conn:
        assert tokens.authenticate(conn, live_secret) == live
        assert tokens.authenticate(conn, dead_secret) is None


def test_rebuild_ignores_job_streams(engine: Engine) -> None:
    with transaction(engine) as conn:
        store.append(conn, "jobs/tokens/x", 0, "job.enqueued", {"jobId": "x"})
        assert tokens.rebuild(conn) == 0


def test_scopes_and_expiry_are_on_the_receipt_and_rebuild_from_it(engine: Engine) -> None:
    info, _secret = tokens.create(
        engine, "org-1", scopes=["commands", "commands"], expires_in=timedelta(hours=1)
    )
    assert info.scopes == ("commands",)
    with engine.connect() as conn:
        [created] = store.read_stream(conn, f"tokens/{info.id}")
        assert created.body["scopes"] == ["commands"]
        assert created.body["expiresAt"] is not None
    before = token_rows(engine)
    with transaction(engine) as conn:
        assert tokens.rebuild(conn) == 1
    assert token_rows(engine) == before


def test_an_expired_token_authenticates_nobody(engine: Engine) -> None:
    info, secret = tokens.create(engine, "org-1", expires_in=timedelta(seconds=30))
    assert info.expires_at is not None
    with engine.connect() as conn:
        assert tokens.authenticate(conn, secret) is not None
        assert tokens.authenticate(conn, secret, now=info.expires_at) is None
        assert tokens.is_live(conn, info.id)
        assert not tokens.is_live(conn, info.id, now=info.expires_at + timedelta(seconds=1))
        assert tokens.lookup(conn, secret) is not None  # still found: the API says "expired"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [({"scopes": ["admin"]}, "unknown scope 'admin'"), ({"expires_in": timedelta(0)}, "future")],
)
def test_bad_scopes_or_expiry_write_nothing(engine: Engine, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tokens.create(engine, "org-1", **kwargs)
    assert token_rows(engine) == []
