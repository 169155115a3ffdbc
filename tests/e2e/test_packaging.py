"""A non-editable install works: ``pip install .`` into a fresh venv, then the installed commands.

The fresh venv gets the project's dependencies from the development venv's site-packages (a
``.pth`` line, so only the build backend is fetched, as ``make install`` does), but *not* its
editable install of this tree: a ``.pth`` file inside an added directory is not processed, so
the editable finder never loads. Every
command runs from a neutral directory with no ``PYTHONPATH``, and the test first proves that
``app`` is imported from the fresh venv's site-packages, not from the checkout.

Then: ``import celeryconfig`` and Celery reading it by name; ``receipt migrate``; ``receipt up``
until ``/healthz`` answers; and every Procfile line, started together on the embedded broker,
until each says it is up (web answers ``/healthz``, each worker prints ``ready``, beat starts,
Flower listens), then stopped by PID. A line that is a plain ``celery`` command runs as
``python -m celery`` of the fresh venv.
"""

from __future__ import annotations

import shlex
import shutil
import signal
import subprocess
import sysconfig
from pathlib import Path

import pytest
import requests

from tests.support.processes import PYTHON, REPO_ROOT, Harness, Proc, base_env, wait_started
from tests.support.waiting import free_port, port_open, wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.xdist_group("e2e")]

BOOT_S = 90.0
# What is not part of the source tree a user would `pip install .` from.
_NOT_SOURCE = shutil.ignore_patterns(
    ".venv", ".git", "__pycache__", ".receipt", "*.egg-info", "build", "dist", ".*_cache", ".hypothesis"
)


def _run(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 180) -> str:
    out = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    assert out.returncode == 0, f"{shlex.join(argv)} exited {out.returncode}:\n{out.stdout}\n{out.stderr}"
    return out.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with this tree installed non-editable; returns its bin directory."""
    root = tmp_path_factory.mktemp("packaging")
    source = root / "src"
    shutil.copytree(REPO_ROOT, source, ignore=_NOT_SOURCE)
    venv = root / "venv"
    _run([PYTHON, "-m", "venv", "--without-pip", str(venv)], base_env(), root)
    fresh_python = venv / "bin" / "python"
    purelib = _run(
        [str(fresh_python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        base_env(),
        root,
    ).strip()
    # The dependencies, from the development venv (never its editable install: see the docstring).
    Path(purelib, "receipt-test-dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    # ``pip install .`` in its two steps: build the wheel in an isolated build environment (the
    # backend from pip's index or cache, as for ``make install``), then install that wheel without
    # dependencies (already there) into the fresh venv.
    wheels = root / "wheels"
    build = [PYTHON, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(wheels), str(source)]
    _run(build, base_env(), root, timeout=300)
    [wheel] = wheels.glob("receipt-*.whl")
    install = [PYTHON, "-m", "pip", "--python", str(fresh_python), "install", "--quiet", "--no-deps"]
    # --ignore-installed: the development venv's editable ``receipt`` is visible through the .pth
    # and would otherwise count as "already satisfied".
    _run([*install, "--no-index", "--ignore-installed", str(wheel)], base_env(), root)
    return venv / "bin"


@pytest.fixture
def neutral(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A working directory outside the checkout and an environment without PYTHONPATH."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    env = base_env(handlers="", RECEIPT_HOME=str(tmp_path / "home"), WEB_CONCURRENCY="1")
    env.pop("PYTHONPATH")
    return cwd, env


def test_the_install_is_not_editable(installed: Path, neutral: tuple[Path, dict[str, str]]) -> None:
    cwd, env = neutral
    script = (
        "import app, celeryconfig, app.storage.migrate as m, api, tasks.worker, workers, receipt; "
        "from pathlib import Path; "
        "print(Path(app.__file__).resolve()); "
        "print(sorted(p.name for p in (Path(m.__file__).parent / 'migrations').iterdir()))"
    )
    where, migrations = _run([str(installed / "python"), "-c", script], env, cwd).splitlines()
    assert Path(where).is_relative_to(installed.parent.resolve()), f"app imported from {where}"
    assert not Path(where).is_relative_to(REPO_ROOT)
    assert "script.py.mako" in migrations and "versions" in migrations and "env.py" in migrations


def test_the_installed_test_kit_runs_a_handler(installed: Path, neutral: tuple[Path, dict[str, str]]) -> None:
    """``receipt.testing`` ships with the package: from the installed copy (its migrations included)
    a job runs through the worker path; the development harness is the repository's, not the wheel's."""
    cwd, env = neutral
    script = (
        "import receipt.testing as t; from pathlib import Path; "
        "rt = t.InlineRuntime({'greeter': lambda ctx: {'hi': ctx.payload['name']}}); "
        "rt.enqueue('greeter', {'name': 'Ada'}); [ran] = rt.drain(); rt.close(); "
        "print(Path(t.__file__).resolve()); print(ran.status, ran.job.result['hi'])"
    )
    where, outcome = _run([str(installed / "python"), "-c", script], env, cwd).splitlines()
    assert Path(where).is_relative_to(installed.parent.resolve()), f"receipt.testing imported from {where}"
    assert outcome == "completed Ada"
    missing = subprocess.run(
        [str(installed / "python"), "-c", "import devharness"],
        env=env,
        cwd=cwd,
        capture_output=True,
        timeout=60,
    )
    assert missing.returncode != 0 and b"ModuleNotFoundError" in missing.stderr


def test_celeryconfig_is_installed_and_celery_reads_it_by_name(
    installed: Path, neutral: tuple[Path, dict[str, str]]
) -> None:
    """The top-level ``celeryconfig`` module a Celery user looks for: installed with the package
    (``py-modules``), importable from any directory, and what ``config_from_object`` reads."""
    cwd, env = neutral
    _run([str(installed / "python"), "-c", "import celeryconfig"], env, cwd)
    script = (
        "import celeryconfig; from celery import Celery; "
        "app = Celery('reader', set_as_current=False); app.config_from_object('celeryconfig'); "
        "print(celeryconfig.__file__); print(app.conf.broker_url); print(app.conf.task_default_queue)"
    )
    where, broker, queue = _run(
        [str(installed / "python"), "-c", script], {**env, "REDIS_URL": "redis://127.0.0.1:1/0"}, cwd
    ).splitlines()
    assert Path(where).is_relative_to(installed.parent.resolve()), f"celeryconfig imported from {where}"
    assert (broker, queue) == ("redis://127.0.0.1:1/0", "receipt-driver")


def test_receipt_migrate_then_receipt_up_reaches_healthz(
    installed: Path, neutral: tuple[Path, dict[str, str]], harness: Harness
) -> None:
    cwd, env = neutral
    _run([str(installed / "receipt"), "migrate"], env, cwd)
    port = free_port()
    up = harness.start("receipt-up", [str(installed / "receipt"), "up", "--port", str(port)], env, cwd=cwd)
    _wait_healthz(up, port)
    up.popen.send_signal(signal.SIGINT)
    assert up.popen.wait(timeout=60) == 0, up.tail()


def test_every_procfile_line_starts(
    installed: Path, neutral: tuple[Path, dict[str, str]], harness: Harness
) -> None:
    cwd, env = neutral
    lines = dict(
        line.split(": ", 1) for line in (REPO_ROOT / "Procfile").read_text().splitlines() if line.strip()
    )
    assert set(lines) == {"release", "web", "driver", "chat", "codex", "control", "beat", "flower"}

    def argv(name: str) -> list[str]:
        program, *args = shlex.split(lines[name])
        if (installed / program).exists():  # python, receipt: the fresh venv's own
            return [str(installed / program), *args]
        # A dependency's script (gunicorn, celery) is not in this venv's bin: the dependencies come
        # by a .pth.
        return [str(installed / "python"), "-m", program, *args]

    _run(argv("release"), env, cwd)  # receipt migrate
    ports = {"web": free_port(), "flower": free_port()}
    extra = {
        "web": {"PORT": str(ports["web"])},
        "flower": {"PORT": str(ports["flower"]), "FLOWER_BASIC_AUTH": "ops:secret"},
    }
    procs = {
        name: harness.start(name, argv(name), {**env, **extra.get(name, {})}, cwd=cwd)
        for name in ("web", "driver", "chat", "codex", "control", "beat", "flower")
    }
    _wait_healthz(procs["web"], ports["web"])
    for name in ("driver", "chat", "codex", "control"):
        wait_started(procs[name], " ready.", BOOT_S)
    wait_started(procs["beat"], "beat: Starting", BOOT_S)
    wait_for(
        lambda: port_open("127.0.0.1", ports["flower"]) or not procs["flower"].alive(),
        BOOT_S,
        what="flower to listen",
    )
    for proc in procs.values():
        assert proc.alive(), f"{proc.name} exited:\n{proc.tail()}"


def _wait_healthz(proc: Proc, port: int) -> None:
    def healthy() -> bool:
        if not proc.alive():
            return True  # stop waiting; the assertion below says why
        return requests.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200

    wait_for(healthy, BOOT_S, interval=0.5, what=f"{proc.name} /healthz", ignore=(requests.RequestException,))
    assert proc.alive(), f"{proc.name} exited:\n{proc.tail()}"
