"""The dashboard's sign-in: the API's bearer token, kept in an HttpOnly, SameSite=Strict cookie.

The cookie holds ``<nonce>.<token>``: the token is the very secret the JSON API takes (so the
dashboard is scoped exactly like the API, and revoking the token signs the browser out), and
the nonce, new at every sign-in, makes the CSRF token per session. The CSRF token is
``HMAC-SHA256(key=token, msg=nonce)``: only a holder of the cookie can compute it, and it
reveals nothing about the token (the page carries it, never the token). No server-side secret
is needed, so every gunicorn worker and every restart agrees on it.

Cross-site requests are refused twice: the cookie is ``SameSite=Strict`` (a cross-site form
post arrives without it), and every state-changing form carries the CSRF token. Sign-in itself
has no session yet, so it (like every POST) refuses a foreign ``Origin``.

This module never lets the JSON API accept the cookie: only views under ``/ui`` read it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets as secrets_module
from dataclasses import dataclass
from urllib.parse import urlsplit

from flask import Response, request
from sqlalchemy.engine import Engine

from api import auth
from api.auth import Identity
from api.errors import ApiError

COOKIE = "receipt_ui"
UI_PREFIX = "/ui"
# A browser session is at most this old before signing in again (the token itself may live on).
COOKIE_MAX_AGE_SECONDS = 12 * 3600
CSRF_FIELD = "csrf"


@dataclass(frozen=True)
class Session:
    """A signed-in browser: who it acts as, and the CSRF token its forms must carry."""

    identity: Identity
    csrf: str


def cookie_path() -> str:
    """The dashboard's path on this server (under any mount point), which the cookie is limited to."""
    return request.script_root + UI_PREFIX


def csrf_for(nonce: str, token: str) -> str:
    return hmac.new(token.encode(), b"receipt-ui-csrf:" + nonce.encode(), hashlib.sha256).hexdigest()


def check_token(engine: Engine, secret: str) -> Identity | None:
    """The identity of ``secret`` by the API's own rule (``api.auth.identity_for``), or None."""
    try:
        return auth.identity_for(engine, secret)
    except ApiError:
        return None


def current(engine: Engine) -> Session | None:
    """The session of this request's cookie, if its token is still live."""
    raw = request.cookies.get(COOKIE)
    if not raw:
        return None
    nonce, sep, secret = raw.partition(".")
    if not sep or not nonce or len(nonce) > 64:
        return None
    identity = check_token(engine, secret)
    if identity is None:
        return None
    return Session(identity, csrf_for(nonce, secret))


def start(response: Response, secret: str) -> None:
    """Set the session cookie for ``secret`` (already checked) on ``response``."""
    nonce = secrets_module.token_urlsafe(16)
    response.set_cookie(
        COOKIE,
        f"{nonce}.{secret}",
        max_age=COOKIE_MAX_AGE_SECONDS,
        path=cookie_path(),
        httponly=True,
        samesite="Strict",
        # gunicorn sets the scheme from X-Forwarded-Proto for trusted proxies, so this holds
        # behind a TLS-terminating proxy too.
        secure=request.is_secure,
    )


def end(response: Response) -> None:
    response.delete_cookie(
        COOKIE, path=cookie_path(), httponly=True, samesite="Strict", secure=request.is_secure
    )


def csrf_ok(session: Session, submitted: str | None) -> bool:
    return submitted is not None and hmac.compare_digest(session.csrf, submitted)


def same_origin() -> bool:
    """False when the browser says the request came from another origin.

    Browsers send ``Origin`` on every POST; a missing one (old clients, test tools) is left to
    the cookie's SameSite rule and the CSRF token.
    """
    origin = request.headers.get("Origin")
    if origin is None:
        return True
    if origin == "null":
        return False
    parts = urlsplit(origin)
    return f"{parts.scheme}://{parts.netloc}" == f"{request.scheme}://{request.host}"


def safe_next(target: str | None) -> str | None:
    """A post-sign-in redirect target, only if it is a path inside the dashboard (no open redirect)."""
    root = cookie_path()
    if not target or (target != root and not target.startswith(root + "/")):
        return None
    if target.startswith("//") or "\\" in target or any(ord(ch) < 32 for ch in target):
        return None
    return target
