"""The dashboard's templates and static files ship in the package (pyproject package-data)."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_template_and_static_file_is_package_data() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = config["tool"]["setuptools"]["package-data"]["api"]
    files = [
        p.relative_to(ROOT / "api").as_posix()
        for folder in ("ui/templates", "ui/static")
        for p in (ROOT / "api" / folder).iterdir()
        if p.is_file()
    ]
    assert files
    missing = [f for f in files if not any(fnmatch.fnmatch(f, pattern) for pattern in patterns)]
    assert missing == []


def test_no_page_loads_anything_from_another_host() -> None:
    # The dashboard must work offline: no CDN, no remote font, no absolute URL in a template or asset.
    for path in (ROOT / "api" / "ui").rglob("*"):
        if path.suffix in (".html", ".css", ".js"):
            body = path.read_text()
            assert "http://" not in body and "https://" not in body and "//cdn" not in body, path
