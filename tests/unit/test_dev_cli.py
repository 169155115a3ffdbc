"""The developer CLI is reached through the one ``receipt`` entry point and fails clearly without a URL."""

from __future__ import annotations

import pytest

from app.ops.cli import main


def test_jobs_group_is_reached_from_the_receipt_entry_point(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["jobs", "--help"]) == 0
    assert "Jobs on the deployment at RECEIPT_URL" in capsys.readouterr().out


def test_a_missing_url_is_a_usage_error_naming_the_variable(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["jobs", "show", "job-1"]) == 2
    assert "RECEIPT_URL" in capsys.readouterr().err
