"""Indexes that keep the list and redrive queries flat as the history grows.

* ``ix_jobs_org_status_created`` — ``GET /jobs?status=…`` filters an organisation's jobs by
  status, newest first. ``ix_jobs_org_created`` alone walks every newer job of the organisation
  to find the queued ones: with a million finished jobs around a stuck backlog that walk is the
  whole history.
* ``ix_jobs_queued_since`` — the queued redrive orders queued jobs by the time they became
  deliverable, ``coalesce(available_at, status_changed_at)``. A partial expression index over
  queued rows only lets it read its batch in order instead of sorting the whole backlog; it
  stays as small as the backlog, whatever the history. PostgreSQL only: SQLAlchemy cannot
  reflect an SQLite expression index (so the schema check could not see it), and the embedded
  SQLite deployment never holds such a history.

Both are plain projection indexes: ``receipt rebuild-projections`` needs nothing new. Measured
by ``bench/scale.py`` (figures in ``bench/README.md``).

Revision ID: 0006
Revises: 0005
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

QUEUED = sa.text("status = 'queued'")


def upgrade() -> None:
    op.create_index(
        "ix_jobs_org_status_created", "jobs", ["organization_id", "status", "created_at", "id"]
    )
    if op.get_bind().dialect.name == "postgresql":
        op.create_index(
            "ix_jobs_queued_since",
            "jobs",
            [sa.text("coalesce(available_at, status_changed_at)")],
            postgresql_where=QUEUED,
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_index("ix_jobs_queued_since", table_name="jobs")
    op.drop_index("ix_jobs_org_status_created", table_name="jobs")
