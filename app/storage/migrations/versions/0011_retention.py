"""Retention: tombstones of archived streams, and the append-only trigger's one exception.

``archived_streams`` keeps one row per stream the archiving pass moved to the archive; the delete
trigger on ``receipts`` now lets a receipt go only under the pass's guard (PostgreSQL: the
transaction-local setting ``receipt.archiving`` holds the pass id; SQLite: a row of
``archive_guard``) and only when the stream's tombstone names that pass and covers the receipt's
seq. ``archive_segments`` logs each segment a pass committed, in the transaction of its tombstones
(what the system page reads, and the segments the pass's sweep keeps). UPDATE and TRUNCATE stay
refused on every path. Expand-only: new tables, two indexes, and a trigger that refuses everything
the previous release ever tried (it never deletes a receipt).

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

_Time = sa.DateTime(timezone=True)
MESSAGE = "receipts are append-only"
GUARD = "receipt.archiving"
_BY_JOB = (("ix_callback_outbox_job", "callback_outbox"), ("ix_durable_workflows_job", "durable_workflows"))


def upgrade() -> None:
    op.create_table(
        "archived_streams",
        sa.Column("stream", sa.String(512), primary_key=True),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("key", sa.String(384), nullable=False),
        sa.Column("organization_id", sa.String(256), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("receipt_count", sa.Integer, nullable=False),
        sa.Column("final_hash", sa.String(64), nullable=False),
        sa.Column("ended_at", _Time, nullable=False),
        sa.Column("segment", sa.String(256), nullable=False),
        sa.Column("pass_id", sa.String(64), nullable=False),
        sa.Column("archived_at", _Time, nullable=False),
        sa.Column("summary", sa.JSON(), nullable=False),
    )
    op.create_table(
        "archive_segments",
        sa.Column("segment", sa.String(256), primary_key=True),
        sa.Column("pass_id", sa.String(64), nullable=False),
        sa.Column("streams", sa.Integer, nullable=False),
        sa.Column("receipts", sa.Integer, nullable=False),
        sa.Column("bytes", sa.BigInteger, nullable=False),
        sa.Column("written_at", _Time, nullable=False),
    )
    op.create_index("ix_archive_segments_written", "archive_segments", ["written_at"])
    op.create_table("archive_guard", sa.Column("pass_id", sa.String(64), primary_key=True))
    # The pass removes a page's callback-outbox and ledger rows by job: without these, each page
    # would scan both tables. A deployment whose tables are large builds them first without
    # blocking writes (`CREATE INDEX CONCURRENTLY IF NOT EXISTS ...`, docs/runbook.md): then
    # nothing is built here.
    for name, table in _BY_JOB:
        op.create_index(name, table, ["job_id"], if_not_exists=True)
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"""
            CREATE OR REPLACE FUNCTION receipts_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
            DECLARE
                pass text := current_setting('{GUARD}', true);
            BEGIN
                IF TG_OP = 'DELETE' AND pass IS NOT NULL AND pass <> '' AND EXISTS (
                    SELECT 1 FROM archived_streams a
                    WHERE a.stream = OLD.stream AND a.pass_id = pass AND a.receipt_count >= OLD.seq
                ) THEN
                    RETURN OLD;
                END IF;
                RAISE EXCEPTION '{MESSAGE}' USING ERRCODE = 'restrict_violation';
            END $$;
        """)
    else:
        op.execute("DROP TRIGGER receipts_no_delete")
        op.execute(f"""
            CREATE TRIGGER receipts_no_delete BEFORE DELETE ON receipts
            WHEN NOT EXISTS (
                SELECT 1 FROM archive_guard g JOIN archived_streams a ON a.pass_id = g.pass_id
                WHERE a.stream = OLD.stream AND a.receipt_count >= OLD.seq
            )
            BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END;
        """)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.execute(f"""
            CREATE OR REPLACE FUNCTION receipts_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION '{MESSAGE}' USING ERRCODE = 'restrict_violation';
            END $$;
        """)
    else:
        op.execute("DROP TRIGGER receipts_no_delete")
        op.execute(f"""
            CREATE TRIGGER receipts_no_delete BEFORE DELETE ON receipts
            BEGIN SELECT RAISE(ABORT, '{MESSAGE}'); END;
        """)
    op.drop_table("archive_guard")
    for name, table in _BY_JOB:
        op.drop_index(name, table_name=table)
    op.drop_index("ix_archive_segments_written", table_name="archive_segments")
    op.drop_table("archive_segments")
    op.drop_table("archived_streams")
