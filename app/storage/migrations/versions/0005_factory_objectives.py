"""Factory objectives: the ``objectives`` and ``objective_tasks`` projections of ``objectives/<id>``.

Projections only, like ``jobs``: ``receipt rebuild-projections`` re-folds them from receipts.

Revision ID: 0005
Revises: 0004
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_Time = sa.DateTime(timezone=True)
_Json = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    op.create_table(
        "objectives",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("organization_id", sa.String(256), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("phase", sa.Integer, nullable=False),
        sa.Column("title", sa.String(256), nullable=False),
        sa.Column("created_at", _Time, nullable=False),
        sa.Column("updated_at", _Time, nullable=False),
        sa.Column("status_changed_at", _Time, nullable=False),
        sa.Column("pending_count", sa.Integer, nullable=False),
        sa.Column("pending_seq", sa.Integer, nullable=True),
        sa.Column("audited", sa.Boolean, nullable=False),
        sa.Column("last_seq", sa.Integer, nullable=False),
        sa.Column("last_hash", sa.String(64), nullable=False),
        sa.Column("state", _Json, nullable=False),
    )
    op.create_index("ix_objectives_org_created", "objectives", ["organization_id", "created_at", "id"])
    op.create_index("ix_objectives_status", "objectives", ["status", "status_changed_at"])
    op.create_index("ix_objectives_pending", "objectives", ["pending_count"])
    op.create_table(
        "objective_tasks",
        sa.Column("objective_id", sa.String(64), primary_key=True),
        sa.Column("task_id", sa.String(64), primary_key=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("job_id", sa.String(128), nullable=True),
        sa.Column("deps_remaining", sa.Integer, nullable=False),
        sa.Column("state", _Json, nullable=False),
    )
    op.create_index("ix_objective_tasks_status", "objective_tasks", ["objective_id", "status"])


def downgrade() -> None:
    op.drop_index("ix_objective_tasks_status", table_name="objective_tasks")
    op.drop_table("objective_tasks")
    op.drop_index("ix_objectives_pending", table_name="objectives")
    op.drop_index("ix_objectives_status", table_name="objectives")
    op.drop_index("ix_objectives_org_created", table_name="objectives")
    op.drop_table("objectives")
