"""``receipt up``'s first screen, its per-role log files, ``--verbose``, and ``receipt logs``."""

from __future__ import annotations

import io
import sys
import threading
from pathlib import Path

import pytest

from app.config import Settings
from app.ops import logtail, supervisor
from app.ops.cli import SUPERVISED_ROLES, main


def settings_at(home: Path) -> Settings:
    return Settings.from_env({"RECEIPT_HOME": str(home)})


def test_the_banner_fits_the_first_screen_and_says_where_everything_is(tmp_path: Path) -> None:
    roles = [spec.name for spec in supervisor.process_specs("127.0.0.1", 8080)]
    lines = supervisor.banner(settings_at(tmp_path), "http://127.0.0.1:8080", "rcpt_x", roles)
    assert len(lines) + 1 <= 15  # plus the "starting N processes" line printed before it
    text = "\n".join(lines)
    assert "http://127.0.0.1:8080" in text and "rcpt_x" in text
    assert "Running: web, driver, chat, codex, control, beat" in text
    assert f"{tmp_path.resolve() / 'logs'}/<role>.log" in text
    assert tuple(roles) == SUPERVISED_ROLES  # `receipt logs ROLE` accepts exactly these


def _run_child(tmp_path: Path, *, verbose: bool) -> tuple[Path, str]:
    log = tmp_path / "x.log"
    spec = supervisor.ProcessSpec("x", (sys.executable, "-c", "print('one'); print('two')"))
    child = supervisor._Child(spec, {"PATH": "/usr/bin:/bin"}, threading.Lock(), log, verbose=verbose)
    child.start()
    assert child.proc is not None
    child.proc.wait(timeout=30)
    child._pumping.join(timeout=30)
    return log, log.read_text()


def test_a_childs_output_goes_to_its_log_file_and_not_the_terminal(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    _, text = _run_child(tmp_path, verbose=False)
    assert text == "one\ntwo\n"
    assert capfd.readouterr().out == ""


def test_verbose_also_streams_it_prefixed(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    _, text = _run_child(tmp_path, verbose=True)
    assert text == "one\ntwo\n"
    assert capfd.readouterr().out == "       x | one\n       x | two\n"


def _write_logs(home: Path) -> None:
    folder = home / "logs"
    folder.mkdir(parents=True)
    (folder / "web.log").write_text("w1\nw2\nw3\n")
    (folder / "chat.log").write_text("c1\n")


def test_logs_prints_one_role_or_all_prefixed(tmp_path: Path) -> None:
    _write_logs(tmp_path)
    out = io.StringIO()
    assert logtail.show(settings_at(tmp_path), "web", follow=False, lines=2, out=out) == 0
    assert out.getvalue() == "w2\nw3\n"
    out = io.StringIO()
    assert logtail.show(settings_at(tmp_path), None, follow=False, lines=5, out=out) == 0
    assert out.getvalue() == "chat | c1\n web | w1\n web | w2\n web | w3\n"


def test_logs_follow_prints_appended_lines(tmp_path: Path) -> None:
    _write_logs(tmp_path)
    out = io.StringIO()
    polls = iter(range(3))

    def keep_going() -> bool:
        n = next(polls, None)
        if n == 0:
            with open(tmp_path / "logs" / "web.log", "a") as fh:
                fh.write("w4\n")
        return n is not None

    assert (
        logtail.show(settings_at(tmp_path), "web", follow=True, lines=1, out=out, keep_going=keep_going) == 0
    )
    assert out.getvalue() == "w3\nw4\n"


def test_logs_without_a_run_says_how_to_start_one(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = io.StringIO()
    assert logtail.show(settings_at(tmp_path), "web", follow=False, lines=5, out=out) == 1
    assert "receipt up" in out.getvalue()
    with pytest.raises(SystemExit):
        main(["logs", "not-a-role"])
    assert "invalid choice" in capsys.readouterr().err
