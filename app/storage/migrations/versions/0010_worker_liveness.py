"""Worker liveness: one row per worker process identity, renewed every couple of seconds.

Best-effort bookkeeping, not truth (app/storage/liveness.py): a live process re-inserts a missing row.
Expand-only: a new table the previous release never reads.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_Time = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "worker_liveness",
        sa.Column("process_id", sa.String(300), primary_key=True),
        sa.Column("role", sa.String(64), nullable=False),
        sa.Column("started_at", _Time, nullable=False),
        sa.Column("renewed_at", _Time, nullable=False),
        sa.Column("dead_at", _Time, nullable=True),
    )
    op.create_index("ix_worker_liveness_renewed", "worker_liveness", ["dead_at", "renewed_at"])


def downgrade() -> None:
    op.drop_index("ix_worker_liveness_renewed", table_name="worker_liveness")
    op.drop_table("worker_liveness")
