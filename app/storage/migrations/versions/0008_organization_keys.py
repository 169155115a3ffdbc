"""Organisation-qualified keys: job and objective keys grow to hold ``<organizationId>/<id>``.

A client's id is unique within its organisation only, so storage keys carry the organisation
(``app.jobs.ids``). Widening a ``varchar`` changes no stored value and, on PostgreSQL, rewrites
neither the table nor its indexes. Rows written before keep their bare keys: their receipts name
them, so a rebuild from receipts gives the same rows. Expand-only: the previous release reads and
writes the wider columns unchanged.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

KEY = 384
# (table, column, old length, new length)
WIDENED = (
    ("jobs", "id", 128, KEY),
    ("deliveries", "job_id", 128, KEY),
    ("deliveries", "dispatch_key", 320, 512),
    ("deliveries", "task_id", 400, 640),
    ("callback_outbox", "job_id", 128, KEY),
    ("objectives", "id", 64, KEY),
    ("objective_tasks", "objective_id", 64, KEY),
    ("objective_tasks", "job_id", 128, KEY),
    ("durable_workflows", "id", 200, 512),
    ("durable_workflows", "objective_id", 64, KEY),
    ("durable_workflows", "job_id", 128, KEY),
    ("durable_activities", "job_id", 128, KEY),
    ("durable_activities", "objective_id", 64, KEY),
)


def _alter(old_or_new: int) -> None:
    tables: dict[str, list[tuple[str, int, int]]] = {}
    for table, column, old, new in WIDENED:
        tables.setdefault(table, []).append((column, old, new))
    for table, columns in tables.items():
        with op.batch_alter_table(table) as batch:
            for column, old, new in columns:
                batch.alter_column(
                    column,
                    type_=sa.String(new if old_or_new == 1 else old),
                    existing_type=sa.String(old if old_or_new == 1 else new),
                )


def upgrade() -> None:
    _alter(1)


def downgrade() -> None:
    _alter(0)
