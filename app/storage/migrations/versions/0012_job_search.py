"""Searching jobs: their tags and error text as columns, and the indexes a filtered list walks.

* ``jobs.tags`` (JSON; JSONB on PostgreSQL, NULL for none) and ``jobs.error_text`` (the start of
  the error's text, ``app.storage.projection.error_text``): projection columns, filled from each
  job's state here (a job enqueued before tags existed has none), and by every transition after.
* ``ix_jobs_org_kind_created``, ``ix_jobs_org_agent_created``: an organisation's jobs of one kind
  (one agent), newest first, without walking its other jobs.
* ``ix_jobs_tags`` (PostgreSQL only, GIN ``jsonb_path_ops``): ``tags @> '{"key": "value"}'``.

Expand-only: two nullable columns and three indexes; a previous release writes rows without them
(NULL: found by no tag or error filter until its next transition). All of it is projection:
``receipt rebuild-projections`` refills both columns from receipts.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

ERROR_TEXT_LENGTH = 256


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    op.add_column("jobs", sa.Column("tags", sa.JSON().with_variant(JSONB(), "postgresql"), nullable=True))
    op.add_column("jobs", sa.Column("error_text", sa.String(ERROR_TEXT_LENGTH), nullable=True))
    # The error's text as projection.error_text reads it: a string, or an object's message.
    if postgres:
        op.execute(f"""
            UPDATE jobs SET error_text = left(CASE jsonb_typeof(state->'error')
                WHEN 'string' THEN state->>'error'
                WHEN 'object' THEN CASE jsonb_typeof(state->'error'->'message')
                    WHEN 'string' THEN state->'error'->>'message' END
                END, {ERROR_TEXT_LENGTH})
            WHERE jsonb_typeof(state->'error') IN ('string', 'object')
        """)
        op.execute("UPDATE jobs SET error_text = NULL WHERE error_text = ''")
    else:
        op.execute(f"""
            UPDATE jobs SET error_text = substr(CASE json_type(state, '$.error')
                WHEN 'text' THEN json_extract(state, '$.error')
                WHEN 'object' THEN CASE json_type(state, '$.error.message')
                    WHEN 'text' THEN json_extract(state, '$.error.message') END
                END, 1, {ERROR_TEXT_LENGTH})
            WHERE json_type(state, '$.error') IN ('text', 'object')
        """)
        op.execute("UPDATE jobs SET error_text = NULL WHERE error_text = ''")
    op.create_index("ix_jobs_org_kind_created", "jobs", ["organization_id", "kind", "created_at", "id"])
    op.create_index("ix_jobs_org_agent_created", "jobs", ["organization_id", "agent_id", "created_at", "id"])
    if postgres:
        op.create_index(
            "ix_jobs_tags", "jobs", ["tags"], postgresql_using="gin", postgresql_ops={"tags": "jsonb_path_ops"}
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_index("ix_jobs_tags", table_name="jobs")
    op.drop_index("ix_jobs_org_agent_created", table_name="jobs")
    op.drop_index("ix_jobs_org_kind_created", table_name="jobs")
    op.drop_column("jobs", "error_text")
    op.drop_column("jobs", "tags")
