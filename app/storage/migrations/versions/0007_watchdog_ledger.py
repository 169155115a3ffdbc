"""The durable ledger: ``durable_workflows`` and ``durable_activities``.

Beside receipts, not above them: rebuildable from receipts (``receipt rebuild-ledger``), written
after the receipt commits and best effort.

Revision ID: 0007
Revises: 0006
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_Time = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "durable_workflows",
        sa.Column("id", sa.String(200), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("objective_id", sa.String(64), nullable=True),
        sa.Column("job_id", sa.String(128), nullable=True),
        sa.Column("organization_id", sa.String(256), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("steps", sa.Integer, nullable=False),
        sa.Column("started_at", _Time, nullable=True),
        sa.Column("ended_at", _Time, nullable=True),
        sa.Column("updated_at", _Time, nullable=False),
    )
    op.create_index("ix_durable_workflows_objective", "durable_workflows", ["objective_id"])
    op.create_table(
        "durable_activities",
        sa.Column("job_id", sa.String(128), primary_key=True),
        sa.Column("attempt", sa.Integer, primary_key=True),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("objective_id", sa.String(64), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("worker_id", sa.String(256), nullable=True),
        sa.Column("started_at", _Time, nullable=False),
        sa.Column("ended_at", _Time, nullable=True),
        sa.Column("duration_ms", sa.Integer, nullable=True),
    )
    op.create_index("ix_durable_activities_objective", "durable_activities", ["objective_id"])


def downgrade() -> None:
    op.drop_index("ix_durable_activities_objective", table_name="durable_activities")
    op.drop_table("durable_activities")
    op.drop_index("ix_durable_workflows_objective", table_name="durable_workflows")
    op.drop_table("durable_workflows")
