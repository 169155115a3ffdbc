"""Receipts (append-only), the jobs and token projections, delivery records, loop bookkeeping.

Revision ID: 0001
Revises:
"""
from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_Time = sa.DateTime(timezone=True)
_Id = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_Json = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

APPEND_ONLY_MESSAGE = "receipts are append-only"


def upgrade() -> None:
    op.create_table(
        "receipts",
        sa.Column("id", _Id, primary_key=True, autoincrement=True),
        sa.Column("stream", sa.String(512), nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("type", sa.String(64), nullable=False),
        sa.Column("body", sa.JSON(), nullable=False),
        sa.Column("at", _Time, nullable=False),
        sa.Column("prev_hash", sa.String(64), nullable=True),
        sa.Column("hash", sa.String(64), nullable=False),
        sa.UniqueConstraint("stream", "seq", name="uq_receipts_stream_seq"),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(128), primary_key=True),
        sa.Column("organization_id", sa.String(256), nullable=True),
        sa.Column("agent_id", sa.String(256), nullable=False),
        sa.Column("lane", sa.String(32), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("session_key", sa.String(512), nullable=True),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("max_attempts", sa.Integer, nullable=False),
        sa.Column("lease_worker_id", sa.String(256), nullable=True),
        sa.Column("lease_attempt", sa.Integer, nullable=True),
        sa.Column("lease_expires_at", _Time, nullable=True),
        sa.Column("abort_requested", sa.Boolean, nullable=False),
        sa.Column("created_at", _Time, nullable=False),
        sa.Column("updated_at", _Time, nullable=False),
        sa.Column("status_changed_at", _Time, nullable=False),
        sa.Column("last_seq", sa.Integer, nullable=False),
        sa.Column("last_hash", sa.String(64), nullable=False),
        sa.Column("state", _Json, nullable=False),
    )
    op.create_index("ix_jobs_status_changed", "jobs", ["status", "status_changed_at"])
    op.create_index("ix_jobs_session_status", "jobs", ["session_key", "status"])
    op.create_index("ix_jobs_agent", "jobs", ["agent_id"])
    op.create_index("ix_jobs_org_created", "jobs", ["organization_id", "created_at", "id"])
    op.create_index("ix_jobs_lease_expiry", "jobs", ["status", "lease_expires_at"])
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(64), primary_key=True),
        sa.Column("organization_id", sa.String(256), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("system", sa.Boolean, nullable=False),
        sa.Column("created_at", _Time, nullable=False),
        sa.Column("revoked_at", _Time, nullable=True),
    )
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
    op.create_table(
        "loop_runs",
        sa.Column("name", sa.String(128), primary_key=True),
        sa.Column("started_at", _Time, nullable=True),
        sa.Column("finished_at", _Time, nullable=True),
        sa.Column("owner", sa.String(256), nullable=True),
    )

    # Append-only for real: the database itself refuses UPDATE, DELETE and TRUNCATE of receipts.
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"""
            CREATE FUNCTION receipts_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION '{APPEND_ONLY_MESSAGE}' USING ERRCODE = 'restrict_violation';
            END $$;
        """)
        op.execute("""
            CREATE TRIGGER receipts_no_update_delete BEFORE UPDATE OR DELETE ON receipts
            FOR EACH ROW EXECUTE FUNCTION receipts_append_only();
        """)
        op.execute("""
            CREATE TRIGGER receipts_no_truncate BEFORE TRUNCATE ON receipts
            FOR EACH STATEMENT EXECUTE FUNCTION receipts_append_only();
        """)
    else:
        op.execute(f"""
            CREATE TRIGGER receipts_no_update BEFORE UPDATE ON receipts
            BEGIN SELECT RAISE(ABORT, '{APPEND_ONLY_MESSAGE}'); END;
        """)
        op.execute(f"""
            CREATE TRIGGER receipts_no_delete BEFORE DELETE ON receipts
            BEGIN SELECT RAISE(ABORT, '{APPEND_ONLY_MESSAGE}'); END;
        """)


def downgrade() -> None:
    raise NotImplementedError("receipts are append-only; there is no downgrade that keeps them")
