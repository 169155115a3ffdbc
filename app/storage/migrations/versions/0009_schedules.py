"""Schedules: the ``schedules`` projection of ``schedules/<organizationId>/<id>`` streams.

A projection only, like ``jobs``: ``receipt rebuild-projections`` re-folds it from receipts.
Expand-only: a new table the previous release never reads.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_Time = sa.DateTime(timezone=True)
_Json = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "schedules",
        sa.Column("id", sa.String(384), primary_key=True),
        sa.Column("organization_id", sa.String(256), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("next_fire_at", _Time, nullable=True),
        sa.Column("buffered", sa.Boolean, nullable=False),
        sa.Column("created_at", _Time, nullable=False),
        sa.Column("updated_at", _Time, nullable=False),
        sa.Column("last_seq", sa.Integer, nullable=False),
        sa.Column("last_hash", sa.String(64), nullable=False),
        sa.Column("state", _Json, nullable=False),
    )
    op.create_index("ix_schedules_due", "schedules", ["status", "next_fire_at"])
    op.create_index("ix_schedules_org_created", "schedules", ["organization_id", "created_at", "id"])
    op.create_index("ix_schedules_buffered", "schedules", ["buffered"])


def downgrade() -> None:
    op.drop_index("ix_schedules_buffered", table_name="schedules")
    op.drop_index("ix_schedules_org_created", table_name="schedules")
    op.drop_index("ix_schedules_due", table_name="schedules")
    op.drop_table("schedules")
