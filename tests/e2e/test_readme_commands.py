"""The README's "Using it" commands, run exactly as written against ``receipt up``.

``receipt up`` starts in a temporary RECEIPT_HOME on a free port, with commands enabled as the
section says to start it; its banner's export line gives ``RECEIPT_URL`` and ``RECEIPT_TOKEN``, as
it does a reader. The section's ``sh`` blocks then run in one bash, from the checkout, each command
followed by a marker with its exit status, so every command is checked on its own: it exits 0,
and the ones that show something show it (a job completes, its events and receipts are served).
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
import requests

from app.ops.supervisor import TRY_COMMAND
from tests.support.processes import REPO_ROOT, Harness, base_env
from tests.support.up import start_up
from tests.support.waiting import free_port, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e")]

SECTION = "## Using it"
RUN_TIMEOUT_S = 240
MARK = "@@readme-command"


def using_it_blocks(readme: str) -> list[str]:
    """The ``sh`` fenced blocks of the README's "Using it" section."""
    section = readme.split(f"\n{SECTION}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"^```sh\n(.*?)^```$", section, flags=re.MULTILINE | re.DOTALL)


def commands_of(block: str) -> list[str]:
    """One entry per command: continuation lines joined, comment-only and blank lines dropped."""
    commands: list[str] = []
    current = ""
    for line in block.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line + "\n"
        # A command goes on after a trailing backslash, or while a quote is still open.
        if line.endswith("\\") or _open_quote(current):
            continue
        commands.append(current.rstrip("\n"))
        current = ""
    assert not current, f"unterminated command: {current}"
    return commands


def _open_quote(text: str) -> bool:
    try:
        shlex.split(text.replace("\\\n", " "), comments=True)
    except ValueError:
        return True
    return False


def script_of(commands: list[str]) -> str:
    lines = []
    for n, command in enumerate(commands):
        lines += [f"echo '{MARK} {n} start'", command, f'echo "{MARK} {n} exit $?"']
    return "\n".join(lines) + "\n"


def outputs_of(log: str, count: int) -> list[tuple[int, str]]:
    """Each command's (exit status, output) from the markers in the combined output."""
    results = []
    for n in range(count):
        found = re.search(rf"^{MARK} {n} start\n(.*?)^{MARK} {n} exit (\d+)$", log, re.MULTILINE | re.DOTALL)
        assert found, f"command {n} did not finish:\n{log[-3000:]}"
        results.append((int(found.group(2)), found.group(1)))
    return results


def test_the_readme_section_parses_into_commands_without_placeholders() -> None:
    blocks = using_it_blocks((REPO_ROOT / "README.md").read_text())
    assert blocks, f"no ```sh block in the README's {SECTION!r} section"
    commands = [c for b in blocks for c in commands_of(b)]
    assert len(commands) >= 10
    for command in commands:
        # A <placeholder> cannot run as written; capture the value into a variable instead.
        assert not re.search(r"<[A-Za-z][\w ]*>", command), command
        assert "$RECEIPT/" not in command and "$RECEIPT " not in command, command  # RECEIPT_URL only


def test_every_command_of_the_readme_runs_as_written_against_receipt_up(
    harness: Harness, tmp_path: Path
) -> None:
    commands = [c for b in using_it_blocks((REPO_ROOT / "README.md").read_text()) for c in commands_of(b)]
    env = base_env(RECEIPT_HOME=str(tmp_path / "home"))
    assert env["RECEIPT_CODEX_COMMANDS"] == "enabled"  # as the section says to start it
    up = start_up(harness, env, free_port(), cwd=tmp_path)
    # The banner's suggestion is one of the README's commands, so it too runs as printed.
    assert f"Try:  {TRY_COMMAND}" in up.proc.log() and TRY_COMMAND in commands
    script = tmp_path / "readme.sh"
    script.write_text(script_of(commands))
    # From the checkout, as the section says; the reader's shell has only what the banner exported.
    shell = {k: v for k, v in env.items() if k != "PYTHONPATH"} | up.env()
    run = harness.start("readme", ["bash", str(script)], shell, cwd=REPO_ROOT)
    run.popen.wait(timeout=RUN_TIMEOUT_S)
    log = run.log()
    results = outputs_of(log, len(commands))
    for command, (status, output) in zip(commands, results, strict=True):
        assert status == 0, f"{command}\nexited {status}:\n{output}"

    def output_of(fragment: str) -> str:
        (found,) = [out for command, (_, out) in zip(commands, results, strict=True) if fragment in command]
        return found

    # The banner's command: followed to its end, the command's output in the result.
    followed = output_of("--follow")
    assert "completed attempt 1" in followed and '"outputTail": "hello\\n"' in followed, followed
    assert "completed" in output_of('receipt jobs tail "$JOB"')
    shown = json.loads(output_of('receipt jobs show "$JOB"'))
    assert shown["status"] == "completed" and shown["result"]["outputTail"] == "again\n"
    assert shown["payload"]["authContext"]["organizationId"] == "dev"  # filled from the token
    assert json.loads(output_of("/whoami"))["organizationId"] == "dev"
    assert json.loads(output_of('/jobs/$JOB" -H'))["job"]["id"] == shown["id"]
    events = output_of("/events")
    assert "event: job" in events and '"status":"completed"' in events
    receipts = [r["type"] for r in json.loads(output_of("/receipts"))["receipts"]]
    assert receipts[0] == "job.enqueued" and receipts[-1] == "job.completed"
    canceled = json.loads(output_of('receipt jobs cancel "$SLOW"'))
    assert canceled["status"] == "canceled" or canceled["abortRequested"] is True, canceled

    # The bulk example's jobs complete (each factory.run launches its plan's objective).
    assert "bulk-1" in output_of("--from -") and "bulk-2" in output_of("--from -")
    exported = up.env()
    auth = {"Authorization": f"Bearer {exported['RECEIPT_TOKEN']}"}

    def bulk_settled() -> list[str] | None:
        states = [
            requests.get(f"{exported['RECEIPT_URL']}/jobs/{job_id}", headers=auth, timeout=10).json()["job"][
                "status"
            ]
            for job_id in ("bulk-1", "bulk-2")
        ]
        return states if all(s in ("completed", "failed", "canceled") for s in states) else None

    assert wait_for(bulk_settled, 60, interval=0.25, what="the bulk example's jobs") == [
        "completed",
        "completed",
    ]
