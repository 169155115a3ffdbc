"""Flower never serves unauthenticated beyond this machine, and never refuses to start for want of
credentials (a process runner would stop every process with it)."""

from __future__ import annotations

import pytest

from tasks.flower import flower_argv


@pytest.mark.parametrize("env", [{"FLOWER_BASIC_AUTH": "ops:secret"}, {"FLOWER_AUTH": ".*@example.com"}])
def test_flower_starts_with_authentication_on_the_paas_port(env: dict[str, str]) -> None:
    argv, warning = flower_argv({**env, "PORT": "7000"})
    assert argv == ["flower", "--address=127.0.0.1", "--port=7000"]
    assert warning is None


def test_without_authentication_flower_binds_loopback_with_one_warning_naming_the_setting() -> None:
    argv, warning = flower_argv({})
    assert argv == ["flower", "--address=127.0.0.1", "--port=5555"]
    assert warning is not None and "FLOWER_BASIC_AUTH" in warning and "127.0.0.1" in warning


@pytest.mark.parametrize("address", ["0.0.0.0", "10.1.2.3", "::", "flower.internal"])
def test_off_loopback_without_authentication_flower_stays_on_loopback(address: str) -> None:
    argv, warning = flower_argv({"FLOWER_ADDRESS": address})
    assert argv[1] == "--address=127.0.0.1"
    assert warning is not None and f"not FLOWER_ADDRESS={address}" in warning
    authed, none = flower_argv({"FLOWER_ADDRESS": address, "FLOWER_BASIC_AUTH": "ops:pw"})
    assert authed[1] == f"--address={address}" and none is None


@pytest.mark.parametrize("address", ["127.0.0.1", "::1", "localhost", "127.0.0.2"])
def test_loopback_addresses_are_kept(address: str) -> None:
    argv, warning = flower_argv({"FLOWER_ADDRESS": address})
    assert argv[1] == f"--address={address}"
    assert warning is not None and "(not FLOWER_ADDRESS" not in warning
