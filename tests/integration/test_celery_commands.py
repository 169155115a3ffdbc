"""The Celery command lines a Celery user would type, run as real processes: the configuration
module they read by name, and ``celery beat`` with Receipt's start-up."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.support.processes import PYTHON, REPO_ROOT, base_env


def test_importing_celeryconfig_has_no_side_effect(tmp_path: Path) -> None:
    """A plain import builds nothing: the embedded broker's folders appear on first read."""
    home = tmp_path / "home"
    script = "import celeryconfig, pathlib, sys; print(pathlib.Path(sys.argv[1]).exists())"
    env = base_env(RECEIPT_HOME=str(home))
    out = subprocess.run(
        [PYTHON, "-c", script, str(home)], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "False"
    read = "import celeryconfig; print(celeryconfig.broker_url)"
    out = subprocess.run(
        [PYTHON, "-c", read], env=env, capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == "filesystem://localhost/" and (home / "broker" / "data").is_dir()


def test_plain_celery_beat_refuses_an_invalid_cron(tmp_path: Path) -> None:
    """The Procfile's ``celery -A tasks.celery_app beat`` runs tasks.beat's start-up checks."""
    env = base_env(RECEIPT_HOME=str(tmp_path), RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_CRON="*/5 * * *")
    done = subprocess.run(
        [PYTHON, "-m", "celery", "-A", "tasks.celery_app", "beat", "--loglevel", "INFO"],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert "RECEIPT_FACTORY_OBJECTIVE_WATCHDOG_CRON='*/5 * * *' is not a standard 5-field cron" in done.stderr
    assert "beat: Starting" not in done.stdout + done.stderr
