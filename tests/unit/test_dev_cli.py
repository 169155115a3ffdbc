"""One ``receipt`` command line: every group in ``--help``, one set of variable names, clear usage errors."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from app.config import Settings
from app.ops import supervisor
from app.ops.cli import build_parser, main
from receipt.cli import GROUPS
from receipt.client import Client


def flat(text: str) -> str:
    """Help text with its line wrapping undone."""
    return " ".join(text.split())


def test_jobs_group_is_reached_from_the_receipt_entry_point(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["jobs", "--help"]) == 0
    assert GROUPS["jobs"] in flat(capsys.readouterr().out)


def test_receipt_help_lists_every_command_and_group_with_a_one_line_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    shown = flat(capsys.readouterr().out)
    parser = build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    helps = {choice.dest: choice.help for choice in commands._choices_actions}
    assert set(helps) == set(commands.choices)  # every command has a help line
    assert {"jobs", "objective", "migrate", "up", "logs", "token"} <= set(helps)
    for name, summary in helps.items():
        assert summary and "\n" not in summary, name
        assert f"{name} {flat(summary)}" in shown, name
    for name, summary in GROUPS.items():
        assert helps[name] == summary


def test_a_missing_url_is_a_usage_error_naming_the_variable(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["jobs", "show", "job-1"]) == 2
    assert "RECEIPT_URL" in capsys.readouterr().err


def test_enqueue_quiet_and_follow_do_not_combine(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["jobs", "enqueue", "codex", "--kind", "factory.run", "-q", "--follow"]) == 2
    assert "--quiet" in capsys.readouterr().err


def test_the_banner_and_the_client_use_the_same_variable_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = Settings.from_env({"RECEIPT_HOME": str(tmp_path)})
    lines = supervisor.banner(settings, "http://127.0.0.1:9", "rcpt_t", ["web"])
    (export,) = [line.strip() for line in lines if "export" in line]
    assert export == "export RECEIPT_URL=http://127.0.0.1:9 RECEIPT_TOKEN=rcpt_t"
    monkeypatch.setenv("RECEIPT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("RECEIPT_TOKEN", "rcpt_t")
    client = Client()
    assert (client.url, client.token) == ("http://127.0.0.1:9", "rcpt_t")


def test_the_banner_suggests_the_command_job_only_where_commands_run(tmp_path: Path) -> None:
    on = Settings.from_env({"RECEIPT_HOME": str(tmp_path), "RECEIPT_CODEX_COMMANDS": "enabled"})
    off = Settings.from_env({"RECEIPT_HOME": str(tmp_path)})
    assert supervisor.try_line(on) == f"Try:  {supervisor.TRY_COMMAND}"
    assert supervisor.TRY_COMMAND.startswith("receipt jobs enqueue codex --kind factory.task.run")
    assert "RECEIPT_CODEX_COMMANDS=enabled" in supervisor.try_line(off)
    assert supervisor.try_line(on) in supervisor.banner(on, "http://x", "t", ["web"])
