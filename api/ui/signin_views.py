"""Sign-in and sign-out pages (the only dashboard pages reachable without a session)."""

from __future__ import annotations

from flask import make_response, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from werkzeug.exceptions import NotFound
from werkzeug.wrappers import Response

from api.context import state
from api.ui import BLUEPRINT, blueprint, session

# Where a person's browser lands first: the URL `receipt up` prints, and the README's `/ui`.
LANDING_PATHS = frozenset({"/", session.UI_PREFIX})


def wants_a_page() -> bool:
    """True for a browser's navigation: its Accept header names ``text/html``, ahead of JSON.

    curl (``*/*``), the Python client and scripts asking for JSON name no ``text/html``, or rank
    JSON first, so they keep the API's JSON answers.
    """
    accept = request.accept_mimetypes
    named = any(value == "text/html" and quality > 0 for value, quality in accept)
    return named and accept.best_match(["application/json", "text/html"]) == "text/html"


def browser_landing() -> Response | None:
    """A redirect to the dashboard for a browser opening ``/`` or ``/ui``; None for anything else.

    Runs before the API's Bearer authentication, which would otherwise answer the browser with a
    JSON 401: the dashboard then signs the person in with its own page.
    """
    if request.method in ("GET", "HEAD") and request.path in LANDING_PATHS and wants_a_page():
        return redirect(url_for(f"{BLUEPRINT}.home"))
    return None


@blueprint.get("/")
def home() -> ResponseReturnValue:
    return redirect(url_for(f"{BLUEPRINT}.jobs"))


@blueprint.get("/signin")
def signin() -> ResponseReturnValue:
    target = session.safe_next(request.args.get("next"))
    if session.current(state().engine) is not None:
        return redirect(target or url_for(f"{BLUEPRINT}.jobs"))
    return render_template("signin.html", next=target or "", error=None)


@blueprint.post("/signin")
def signin_submit() -> ResponseReturnValue:
    secret = (request.form.get("token") or "").strip()
    target = session.safe_next(request.form.get("next"))
    if secret.lower().startswith("bearer "):
        secret = secret[len("bearer ") :].strip()
    if session.check_token(state().engine, secret) is None:
        # The form comes back empty: the page never echoes what was typed into it.
        message = "That token is not valid (unknown or revoked)." if secret else "Paste an API token."
        return render_template("signin.html", next=target or "", error=message), 401
    response = make_response(redirect(target or url_for(f"{BLUEPRINT}.jobs")))
    session.start(response, secret)
    return response


@blueprint.post("/signout")
def signout() -> ResponseReturnValue:
    response = make_response(redirect(url_for(f"{BLUEPRINT}.signin")))
    session.end(response)
    return response


@blueprint.route("/<path:rest>", methods=["GET", "POST"])
def unknown(rest: str) -> ResponseReturnValue:
    """Any other path under /ui: the dashboard's own 404 page, not the JSON API's."""
    raise NotFound()
