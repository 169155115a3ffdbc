"""What a dispatch pass reads on every freed place, kept cheap behind a deep line.

* ``ix_jobs_in_flight``: a worker queue's leased and running jobs by organisation and concurrency
  key, the pass's "in flight" count. Partial, so it holds the few attempts running, not the
  history; the general ``(status, …)`` indexes made the count a bitmap scan over every version of
  every job that had run since the last vacuum (4 ms after 9 000 jobs, growing).
* Autovacuum on ``jobs`` and ``deliveries`` at 2 % of their rows instead of PostgreSQL's 20 %:
  both are rewritten several times per job, and their statistics steer the pass's plans. A burst of
  30 000 jobs otherwise waits a minute or more for its first analyse.

Expand-only: an index and storage parameters, which the previous release neither reads nor
minds. PostgreSQL's storage parameters only; SQLite gets the index.

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

HOT_TABLES = ("jobs", "deliveries")
VACUUM = "autovacuum_vacuum_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02"


def upgrade() -> None:
    in_flight = sa.text("status IN ('leased', 'running')")
    op.create_index(
        "ix_jobs_in_flight",
        "jobs",
        ["worker_queue", "organization_id", "concurrency_key"],
        postgresql_where=in_flight,
        sqlite_where=in_flight,
    )
    if op.get_bind().dialect.name == "postgresql":
        for table in HOT_TABLES:
            op.execute(f"ALTER TABLE {table} SET ({VACUUM})")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for table in HOT_TABLES:
            op.execute(
                f"ALTER TABLE {table} RESET (autovacuum_vacuum_scale_factor, autovacuum_analyze_scale_factor)"
            )
    op.drop_index("ix_jobs_in_flight", table_name="jobs")
