"""Flower must not start unauthenticated: its UI would answer anyone (only health may)."""

from __future__ import annotations

import pytest

from app.config import Settings
from tasks.flower import flower_argv

OPEN = Settings.from_env({"RECEIPT_AUTH": "disabled"})


def test_flower_refuses_to_start_without_authentication() -> None:
    with pytest.raises(SystemExit, match="FLOWER_BASIC_AUTH"):
        flower_argv({}, Settings.from_env({}))


@pytest.mark.parametrize("env", [{"FLOWER_BASIC_AUTH": "ops:secret"}, {"FLOWER_AUTH": ".*@example.com"}])
def test_flower_starts_with_authentication_on_the_paas_port(env: dict[str, str]) -> None:
    argv = flower_argv({**env, "PORT": "7000"}, Settings.from_env({}))
    assert argv == ["flower", "--address=127.0.0.1", "--port=7000"]


def test_flower_binds_loopback_by_default_and_may_run_open_there_only_when_receipt_auth_is_disabled() -> None:
    assert flower_argv({}, OPEN) == ["flower", "--address=127.0.0.1", "--port=5555"]


@pytest.mark.parametrize("address", ["0.0.0.0", "10.1.2.3", "::", "flower.internal"])
def test_flower_off_loopback_always_requires_authentication(address: str) -> None:
    """Even RECEIPT_AUTH=disabled does not open Flower beyond this machine."""
    with pytest.raises(SystemExit, match="required even with RECEIPT_AUTH=disabled"):
        flower_argv({"FLOWER_ADDRESS": address}, OPEN)
    authed = flower_argv({"FLOWER_ADDRESS": address, "FLOWER_BASIC_AUTH": "ops:pw"}, OPEN)
    assert f"--address={address}" in authed


@pytest.mark.parametrize("address", ["127.0.0.1", "::1", "localhost", "127.0.0.2"])
def test_loopback_addresses_are_recognised(address: str) -> None:
    assert flower_argv({"FLOWER_ADDRESS": address}, OPEN)[1] == f"--address={address}"
