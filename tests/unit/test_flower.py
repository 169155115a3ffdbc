"""Flower must not start unauthenticated: its UI would answer anyone (only health may)."""

from __future__ import annotations

import pytest

from app.config import Settings
from tasks.flower import flower_argv


def test_flower_refuses_to_start_without_authentication() -> None:
    with pytest.raises(SystemExit, match="FLOWER_BASIC_AUTH"):
        flower_argv({}, Settings.from_env({}))


@pytest.mark.parametrize("env", [{"FLOWER_BASIC_AUTH": "ops:secret"}, {"FLOWER_AUTH": ".*@example.com"}])
def test_flower_starts_with_authentication_on_the_paas_port(env: dict[str, str]) -> None:
    assert flower_argv({**env, "PORT": "7000"}, Settings.from_env({})) == ["flower", "--port=7000"]


def test_flower_may_run_open_only_when_receipt_auth_is_disabled() -> None:
    assert flower_argv({}, Settings.from_env({"RECEIPT_AUTH": "disabled"})) == ["flower", "--port=5555"]
