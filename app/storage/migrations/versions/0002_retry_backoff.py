"""jobs.available_at: the earliest time a retried job may be delivered again (retry backoff).

A projection column, like the rest of ``jobs``: it mirrors ``availableAt`` of the fold (the
``retryAt`` of the last retryable ``job.failed``), so ``receipt rebuild-projections`` restores it.

Revision ID: 0002
Revises: 0001
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs") as batch:
        batch.add_column(sa.Column("available_at", sa.DateTime(timezone=True), nullable=True))
    op.create_index("ix_jobs_available", "jobs", ["status", "available_at"])


def downgrade() -> None:
    op.drop_index("ix_jobs_available", table_name="jobs")
    with op.batch_alter_table("jobs") as batch:
        batch.drop_column("available_at")
