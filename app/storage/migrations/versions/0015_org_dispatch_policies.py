"""Organisation dispatch policies (docs/dispatch.md): the projection of the
``dispatch-policies/<organizationId>`` streams that ``PUT /organizations/{id}/dispatch`` writes.

* ``org_dispatch_policies``: one row per organisation whose weight or rate the API set.

Expand-only: a new table, which the previous release never reads. A projection:
``receipt rebuild-projections`` refills it from receipts.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "org_dispatch_policies",
        sa.Column("organization_id", sa.String(256), primary_key=True),
        sa.Column("weight", sa.Float(), nullable=True),
        sa.Column("rate_per_s", sa.Float(), nullable=True),
        sa.Column("last_seq", sa.Integer(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("org_dispatch_policies")
