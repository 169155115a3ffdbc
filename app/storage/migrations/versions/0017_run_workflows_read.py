"""A ``run`` workflow is read from its job's row: an index for the objective a run names.

The durable ledger's ``run`` workflows (one per ``factory.run`` job) are its job's projection row
read as a workflow (``app/factory/ledger.py``), no longer written to ``durable_workflows`` after
every transition. An objective's ledger summary lists the runs whose payload names it: on
PostgreSQL that lookup goes through ``ix_jobs_run_objective``, a partial index holding only the
``factory.run`` jobs that name an objective, so no other job's write touches it. SQLite reads the
organisation's runs through its other indexes.

Expand-only: an index. The ``run`` rows earlier releases wrote stay where they are, unread (the
previous release still writes and reads them during a rolling deploy); ``receipt rebuild-ledger``
removes them. A deployment with a large ``jobs`` table builds the index first without blocking
writes (``CREATE INDEX CONCURRENTLY IF NOT EXISTS ...``, docs/runbook.md): then nothing is built here.

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

# Spelled as app/factory/ledger.py's read spells it (``db.RUN_OBJECTIVE``), so the planner matches the two.
OBJECTIVE_NAMED = "((state -> 'payload') ->> 'objectiveId')"


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.create_index(
        "ix_jobs_run_objective",
        "jobs",
        [sa.text(OBJECTIVE_NAMED)],
        postgresql_where=sa.text(f"kind = 'factory.run' AND {OBJECTIVE_NAMED} IS NOT NULL"),
        if_not_exists=True,
    )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_index("ix_jobs_run_objective", table_name="jobs")
