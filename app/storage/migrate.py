"""Run Alembic migrations programmatically (``receipt migrate``), with no alembic.ini needed."""

from __future__ import annotations

import logging
from pathlib import Path

# Importing Alembic logs one INFO line per autogenerate plugin it sets up: noise at every start of
# a process that checks its schema (app/ops/preflight.py), and of every `receipt migrate`.
logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)

from alembic import command  # noqa: E402 - after quieting its import-time log lines
from alembic.config import Config  # noqa: E402
from sqlalchemy.engine import Engine  # noqa: E402

MIGRATIONS = Path(__file__).parent / "migrations"


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Bring the database behind ``engine`` to ``revision`` (default: the latest schema)."""
    cfg = alembic_config(engine.url.render_as_string(hide_password=False))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, revision)


def current(engine: Engine) -> str | None:
    from alembic.runtime.migration import MigrationContext

    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
