"""One PostgreSQL database per xdist worker, emptied before each test that uses it.

Cloning a database per test cost about 400 ``CREATE DATABASE … TEMPLATE`` and forced drops a run,
most of a run's start-up system CPU. A test now gets its worker's database with every table
emptied (``TRUNCATE … RESTART IDENTITY``, the migration stamp kept). A test that changes the
database itself (triggers off, storage parameters, its own schema) is marked
``own_database`` and gets a fresh clone, as before.
"""

from __future__ import annotations

from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

# The one row the template holds that a test must find again: the migration stamp.
KEPT_TABLES = frozenset({"alembic_version"})

OWN_DATABASE_MARKER = "own_database"

# The append-only triggers a shared database must still have when a test hands it on.
_GUARD_TRIGGERS = ("receipts_no_update_delete", "receipts_no_truncate")


class DatabaseChanged(AssertionError):
    """A test changed its shared database itself; it must be marked ``own_database``."""


class WorkerDatabase:
    """A migrated database kept for one xdist worker's tests, emptied between them."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._engine: Engine = create_engine(url, poolclass=NullPool)
        with self._engine.connect() as conn:
            names = conn.execute(
                text("SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename")
            ).scalars()
            self._truncate = "TRUNCATE {} RESTART IDENTITY CASCADE".format(
                ", ".join(f'"{n}"' for n in names if n not in KEPT_TABLES)
            )

    def reset(self) -> None:
        """Empty every table, after ending any session a previous test or process left open.

        Session replication role ``replica`` keeps the append-only TRUNCATE trigger from firing in
        this one session; the triggers themselves stay, and are checked to be enabled."""
        with self._engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.execute(
                text(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )
            enabled = set(
                conn.execute(
                    text(
                        "SELECT tgname FROM pg_trigger WHERE tgrelid = 'receipts'::regclass "
                        "AND tgenabled = 'O'"
                    )
                ).scalars()
            )
            missing = [name for name in _GUARD_TRIGGERS if name not in enabled]
            if missing:
                raise DatabaseChanged(
                    f"the shared test database lost its append-only triggers {missing}: the test before "
                    f"changed the database itself; mark it @pytest.mark.{OWN_DATABASE_MARKER}"
                )
            conn.execute(text("SET session_replication_role = replica"))
            conn.execute(text("SET lock_timeout = '10s'"))
            conn.execute(text(self._truncate))
            conn.execute(text("RESET session_replication_role"))

    def close(self) -> None:
        self._engine.dispose()
