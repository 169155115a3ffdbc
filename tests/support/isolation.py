"""One PostgreSQL database per xdist worker, emptied before each test that uses it.

Cloning a database per test cost about 400 ``CREATE DATABASE … TEMPLATE`` and forced drops a run,
most of a run's start-up system CPU. A test now gets its worker's database with every table
emptied (the migration stamp kept) and its sequences back at their start. A test that changes the
database itself (triggers off, storage parameters, its own schema) is marked ``own_database``
and gets a fresh clone, as before.

The tables are emptied with ``DELETE``, not ``TRUNCATE``: a test leaves a few rows in a few
tables, and truncating eighteen tables (each a new file for the table and every index, written
out at commit) took 160-180 ms a test on this machine against 8 ms for the deletes, for about two
thousand PostgreSQL tests a run. A table a test grew past ``TRUNCATE_FROM_BYTES`` (a deployment's
run, a seeded benchmark) is truncated instead, so the next test does not scan what it left dead.
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

# A table this large on disk (table and indexes) is truncated rather than deleted from.
TRUNCATE_FROM_BYTES = 1 << 20

# Every sequence of the schema back to its start, as ``TRUNCATE … RESTART IDENTITY`` would set it.
_RESTART_SEQUENCES = (
    "SELECT setval(s.seqrelid, s.seqstart, false) FROM pg_sequence s "
    "JOIN pg_class c ON c.oid = s.seqrelid WHERE c.relnamespace = 'public'::regnamespace"
)


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
            self._tables = [n for n in names if n not in KEPT_TABLES]

    def reset(self) -> None:
        """Empty every table, after ending any session a previous test or process left open.

        Session replication role ``replica`` keeps the append-only DELETE trigger (and the foreign
        keys' triggers) from firing in this one session; the triggers themselves stay, and are
        checked to be enabled."""
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
            large = set(
                conn.execute(
                    text(
                        "SELECT relname FROM pg_class WHERE relnamespace = 'public'::regnamespace "
                        "AND relkind = 'r' AND pg_total_relation_size(oid) >= :bytes"
                    ),
                    {"bytes": TRUNCATE_FROM_BYTES},
                ).scalars()
            )
            # One round trip; foreign keys are triggers too, so under the replica role the order
            # does not matter.
            statements = [f'DELETE FROM "{n}"' for n in self._tables if n not in large]
            truncated = [f'"{n}"' for n in self._tables if n in large]
            if truncated:  # CASCADE: a table that references one of these is emptied anyway
                statements.append(f"TRUNCATE {', '.join(truncated)} CASCADE")
            conn.exec_driver_sql(
                "SET session_replication_role = replica; SET lock_timeout = '10s'; "
                f"{'; '.join(statements)}; RESET session_replication_role"
            )
            conn.exec_driver_sql(_RESTART_SEQUENCES)

    def close(self) -> None:
        self._engine.dispose()
