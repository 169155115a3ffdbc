"""Dashboard session helpers: CSRF derivation, redirect targets, origin check, time format."""

from __future__ import annotations

import pytest
from flask import Flask

from api.ui import session, short_time


def test_the_csrf_token_depends_on_nonce_and_token_and_reveals_neither() -> None:
    a = session.csrf_for("n1", "rcpt_secret")
    assert a == session.csrf_for("n1", "rcpt_secret")
    assert a != session.csrf_for("n2", "rcpt_secret")
    assert a != session.csrf_for("n1", "rcpt_other")
    assert "secret" not in a and "n1" not in a
    assert len(a) == 64


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("/ui/jobs", "/ui/jobs"),
        ("/ui", "/ui"),
        ("/ui/jobs?status=failed", "/ui/jobs?status=failed"),
        ("/uix", None),
        ("/jobs", None),
        ("//evil.example/ui", None),
        ("https://evil.example/ui/jobs", None),
        ("/ui/\\evil", None),
        ("/ui/\r\nSet-Cookie: x", None),
        ("", None),
        (None, None),
    ],
)
def test_only_dashboard_paths_are_redirect_targets(target: str | None, expected: str | None) -> None:
    with Flask("t").test_request_context("/ui/signin"):
        assert session.safe_next(target) == expected


def test_targets_follow_the_mount_point() -> None:
    with Flask("t").test_request_context("/ui/signin", base_url="http://host/prefix"):
        assert session.cookie_path() == "/prefix/ui"
        assert session.safe_next("/prefix/ui/jobs") == "/prefix/ui/jobs"
        assert session.safe_next("/ui/jobs") is None


@pytest.mark.parametrize(
    ("origin", "ok"),
    [
        (None, True),
        ("http://localhost", True),
        ("http://localhost:8000", False),
        ("null", False),
        ("https://localhost", False),
        ("http://evil.example", False),
    ],
)
def test_same_origin(origin: str | None, ok: bool) -> None:
    headers = {"Origin": origin} if origin else {}
    with Flask("t").test_request_context("/ui/signin", method="POST", headers=headers):
        assert session.same_origin() is ok


def test_short_time() -> None:
    assert short_time("2026-01-02T03:04:05.678901Z") == "2026-01-02 03:04:05.678"
    assert short_time("2026-01-02T03:04:05Z") == "2026-01-02 03:04:05"
    assert short_time(None) == ""
    assert short_time("soon") == "soon"
