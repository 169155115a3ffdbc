"""The sandbox's pure parts: the argv it builds, PID 1's plan, the view's paths, the uid range."""

from __future__ import annotations

import ast
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from app.config import Settings
from workers import sandbox, sandbox_init
from workers.sandbox_users import UidRange

SHARED = Settings(codex_uid_range="none")  # no range: nothing reads the host's user database
ROOT = sandbox.Host(root=True, user_namespaces=True, tools=True)
USERNS = sandbox.Host(root=False, user_namespaces=True, tools=True)
BARE = sandbox.Host(root=False, user_namespaces=False, tools=True)
SCRATCH = Path("/tmp/receipt-codex-abc")
ATTEMPT = sandbox.Attempt(SCRATCH, 1879048200, 1879048200)


def config(**changes: Any) -> sandbox.SandboxConfig:
    return sandbox.SandboxConfig.from_settings(replace(SHARED, **changes))


def plan_of(argv: list[str]) -> dict[str, Any]:
    plan, _ = sandbox_init.parse_plan(argv[argv.index(sandbox.INIT_SCRIPT) + 1 :])
    return plan


def inner_of(argv: list[str]) -> list[str]:
    """What PID 1 runs: the words after its plan."""
    return argv[argv.index("--", argv.index(sandbox.INIT_SCRIPT)) + 1 :]


def test_the_init_imports_only_the_standard_library() -> None:
    # It runs with -I -S, and once the root has moved nothing outside the view can be imported.
    tree = ast.parse(Path(sandbox_init.__file__).read_text())
    roots: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            roots.add(node.module.split(".")[0])
    assert roots <= set(sys.stdlib_module_names), roots - set(sys.stdlib_module_names)


def test_a_root_worker_runs_the_command_as_its_attempts_user_in_every_namespace() -> None:
    argv = sandbox.build_argv(["make", "test"], config(), ROOT, ATTEMPT, SCRATCH)
    unshare = argv[argv.index("unshare") : argv.index(sys.executable)]
    assert unshare == ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--ipc", "--net", "--"]
    assert inner_of(argv) == [
        "setpriv",
        "--reuid=1879048200",
        "--regid=1879048200",
        "--clear-groups",
        "--no-new-privs",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--",
        "make",
        "test",
    ]


def test_in_a_user_namespace_the_command_keeps_no_capability() -> None:
    argv = sandbox.build_argv(["true"], config(), USERNS, sandbox.Attempt(SCRATCH), SCRATCH)
    assert argv[argv.index("unshare") + 1 : argv.index("unshare") + 3] == ["--user", "--map-root-user"]
    assert inner_of(argv) == [
        "setpriv",
        "--no-new-privs",
        "--inh-caps=-all",
        "--bounding-set=-all",
        "--",
        "true",
    ]
    assert plan_of(argv)["view"] is not None
    assert plan_of(argv)["user"] is None  # unshare --user made the command's user namespace already


def test_without_namespaces_only_the_rlimits_wrap_the_command() -> None:
    argv = sandbox.build_argv(["true"], config(), BARE, sandbox.Attempt(SCRATCH), SCRATCH)
    assert "unshare" not in argv and sandbox.INIT_SCRIPT not in argv
    assert argv[-2:] == ["--", "true"]


def test_a_root_worker_refuses_to_run_a_command_without_a_user() -> None:
    with pytest.raises(sandbox.SandboxRefused):
        sandbox.build_argv(["true"], config(), ROOT, sandbox.Attempt(SCRATCH), SCRATCH)


def test_the_plan_keeps_the_scratch_directory_and_the_workspace_and_shows_the_visible_trees() -> None:
    cfg = config(codex_workspace_root="/srv/ws", codex_visible_paths="/usr,/etc", codex_tmpfs_mb=16)
    plan = sandbox.init_plan(cfg, ROOT, ATTEMPT, Path("/srv/ws/repo"))
    assert plan == {
        "view": {"visible": ["/usr", "/etc"], "keep": [str(SCRATCH), "/srv/ws"], "tmpfs_mb": 16},
        "user": [1879048200, 1879048200],  # a user namespace of its own, mapping only this user
        "cwd": "/srv/ws/repo",
    }
    old_kernel = replace(ROOT, views=False)
    assert sandbox.init_plan(cfg, old_kernel, ATTEMPT, SCRATCH) == {
        "view": None,
        "user": [1879048200, 1879048200],  # needs no syscall table: it stays
        "cwd": str(SCRATCH),
    }
    assert sandbox.init_plan(cfg, USERNS, sandbox.Attempt(SCRATCH), SCRATCH)["user"] is None
    refused = replace(ROOT, user_namespaces=False)  # user.max_user_namespaces=0: setpriv alone
    assert sandbox.init_plan(cfg, refused, ATTEMPT, SCRATCH)["user"] is None
    assert sandbox.init_plan(config(codex_filesystem="host"), ROOT, ATTEMPT, SCRATCH)["view"] is None


@pytest.mark.parametrize(
    ("path", "seen"),
    [
        ("/usr/bin/python3", True),
        ("/bin/echo", True),
        ("/tmp/receipt-codex-abc/tool", True),
        ("/srv/ws/repo/tool", True),
        ("/srv/wsx/tool", False),
        ("/root/.pyenv/bin/python", False),
        ("/home/alice/tool", False),
        ("/tmp/receipt-codex-abcd/tool", False),
    ],
)
def test_what_is_visible_in_a_commands_view(path: str, seen: bool) -> None:
    cfg = config(codex_workspace_root="/srv/ws")
    assert sandbox.visible(Path(path), cfg, ROOT, ATTEMPT) is seen
    assert sandbox.visible(Path(path), replace(cfg, filesystem="host"), ROOT, ATTEMPT) is True


def test_a_symlink_out_of_a_visible_tree_is_not_visible(tmp_path: Path) -> None:
    tools = tmp_path / "tools"
    tools.mkdir()
    (tmp_path / "hidden").mkdir()
    (tmp_path / "hidden" / "tool").write_text("")
    (tools / "inside").write_text("")
    (tools / "out").symlink_to(tmp_path / "hidden" / "tool")
    (tools / "in").symlink_to(tools / "inside")
    cfg = config(codex_visible_paths=str(tools))
    assert sandbox.visible(tools / "in", cfg, ROOT, ATTEMPT) is True
    assert sandbox.visible(tools / "out", cfg, ROOT, ATTEMPT) is False


@pytest.mark.parametrize(
    ("text", "parsed"),
    [
        ("1879048192-1879052287", UidRange(1879048192, 1879052287)),
        (" 200000-200000 ", UidRange(200000, 200000)),
        ("none", None),
        ("NONE", None),
    ],
)
def test_a_uid_range_parses(text: str, parsed: UidRange | None) -> None:
    assert UidRange.parse(text) == parsed


@pytest.mark.parametrize("text", ["", "5", "a-b", "10-5", "0-10", "65530-65540", "1-4294967295", "-5-7"])
def test_a_bad_uid_range_is_refused_naming_the_setting(text: str) -> None:
    with pytest.raises(ValueError, match="RECEIPT_CODEX_UID_RANGE"):
        UidRange.parse(text)


def test_visible_paths_must_be_absolute_normalised_and_not_the_root() -> None:
    assert config(codex_visible_paths=" /usr , /etc,/usr,").visible_paths == ("/usr", "/etc")
    for bad in ("usr", "/usr/../etc", "/", "/usr/"):
        with pytest.raises(ValueError, match="RECEIPT_CODEX_VISIBLE_PATHS"):
            config(codex_visible_paths=bad)


@pytest.mark.parametrize(
    "plan",
    [
        {"view": None, "user": None, "cwd": "/tmp/receipt-codex-abc"},
        {
            "view": {"visible": ["/usr", "/a=b"], "keep": ["/tmp/x y", "/srv/ws"], "tmpfs_mb": 16},
            "user": [1879048200, 1879048201],
            "cwd": "/srv/ws/--",
        },
    ],
)
def test_the_plan_travels_in_argv_words_and_comes_back_whole(plan: dict[str, Any]) -> None:
    words = sandbox_init.plan_args(plan)
    assert sandbox_init.parse_plan([*words, "--", "make", "--", "x"]) == (plan, ["make", "--", "x"])


def test_an_unknown_plan_word_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown plan word"):
        sandbox_init.parse_plan(["cwd=/", "mystery=1", "--", "true"])
