"""The dashboard's no-secrets rule for displayed JSON."""

from __future__ import annotations

import pytest

from api.ui import redact


@pytest.mark.parametrize(
    "key",
    [
        "token",
        "apiKey",
        "api_key",
        "API-KEY",
        "password",
        "passwd",
        "clientSecret",
        "Authorization",
        "access_token",
        "refreshToken",
        "privateKey",
        "credentials",
        "cookie",
        "signature",
    ],
)
def test_secret_names_are_hidden(key: str) -> None:
    assert redact.is_secret_key(key)
    assert redact.redact({key: "s3cr3t"}) == {key: redact.REDACTED}


@pytest.mark.parametrize("key", ["kind", "authContext", "organizationId", "userId", "sessionKey", "prompt"])
def test_ordinary_names_are_shown(key: str) -> None:
    assert not redact.is_secret_key(key)
    assert redact.redact({key: "v"}) == {key: "v"}


def test_redaction_reaches_any_depth_and_leaves_the_input_alone() -> None:
    value = {"a": [{"b": {"password": "p", "keep": 1}}], "token": {"nested": "x"}}
    assert redact.redact(value) == {
        "a": [{"b": {"password": redact.REDACTED, "keep": 1}}],
        "token": redact.REDACTED,
    }
    assert value["a"][0]["b"]["password"] == "p"  # type: ignore[index]
    assert '"password": "p"' not in redact.pretty(value)


def test_brief_cuts_long_values_and_hides_secrets() -> None:
    assert redact.brief(None) == ""
    assert redact.brief("x" * 100, 10) == "x" * 9 + "…"
    assert "hunter2" not in redact.brief({"password": "hunter2"})
