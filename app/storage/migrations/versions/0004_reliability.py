"""Reliability: structured delivery keys, loop claims with a deadline.

- ``deliveries`` is re-keyed by (job id, purpose, observed state, generation) instead of the
  spec's key text, which a client jobId containing ':' could collide with; it also records the
  broker epoch its message went to. The table is best-effort bookkeeping (losing it loses no job:
  the queued redrive re-delivers from receipts), so it is recreated rather than converted.
- ``loop_runs.expires_at``: a claim's deadline, renewed by a live pass.
- ``callback_outbox``: durable, signed callbacks, written with the receipt that causes them.

Revision ID: 0004
Revises: 0003
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_Time = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.drop_index("ix_deliveries_job", table_name="deliveries")
    op.drop_table("deliveries")
    op.create_table(
        "deliveries",
        sa.Column("job_id", sa.String(128), primary_key=True),
        sa.Column("purpose", sa.String(16), primary_key=True),
        sa.Column("observed", sa.String(64), primary_key=True),
        sa.Column("generation", sa.Integer, primary_key=True),
        sa.Column("dispatch_key", sa.String(320), nullable=False),
        sa.Column("task_id", sa.String(400), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("outcome", sa.String(64), nullable=True),
        sa.Column("broker_epoch", sa.String(64), nullable=True),
        sa.Column("created_at", _Time, nullable=False),
        sa.Column("deadline_at", _Time, nullable=False),
        sa.Column("settled_at", _Time, nullable=True),
    )
    op.create_index("ix_deliveries_job_created", "deliveries", ["job_id", "created_at"])
    op.create_index("ix_deliveries_state", "deliveries", ["state", "deadline_at"])
    with op.batch_alter_table("loop_runs") as batch:
        batch.add_column(sa.Column("expires_at", _Time, nullable=True))
    op.create_table(
        "callback_outbox",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), primary_key=True, autoincrement=True),
        sa.Column("event_id", sa.String(64), nullable=False),
        sa.Column("target", sa.String(2048), nullable=False),
        sa.Column("job_id", sa.String(128), nullable=False),
        sa.Column("event", sa.String(16), nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("next_attempt_at", _Time, nullable=False),
        sa.Column("created_at", _Time, nullable=False),
        sa.Column("delivered_at", _Time, nullable=True),
        sa.Column("last_error", sa.String(512), nullable=True),
        sa.UniqueConstraint("target", "event_id", name="uq_callback_outbox_target_event"),
    )
    op.create_index("ix_callback_outbox_state", "callback_outbox", ["state", "id"])


def downgrade() -> None:
    op.drop_index("ix_callback_outbox_state", table_name="callback_outbox")
    op.drop_table("callback_outbox")
    with op.batch_alter_table("loop_runs") as batch:
        batch.drop_column("expires_at")
    op.drop_index("ix_deliveries_state", table_name="deliveries")
    op.drop_index("ix_deliveries_job_created", table_name="deliveries")
    op.drop_table("deliveries")
    op.create_table(
        "deliveries",
        sa.Column("dispatch_key", sa.String(256), primary_key=True),
        sa.Column("generation", sa.Integer, primary_key=True),
        sa.Column("job_id", sa.String(128), nullable=False),
        sa.Column("task_id", sa.String(300), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("outcome", sa.String(64), nullable=True),
        sa.Column("created_at", _Time, nullable=False),
        sa.Column("deadline_at", _Time, nullable=False),
        sa.Column("settled_at", _Time, nullable=True),
    )
    op.create_index("ix_deliveries_job", "deliveries", ["job_id", "created_at"])
