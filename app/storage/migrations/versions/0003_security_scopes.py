"""api_tokens.scopes and api_tokens.expires_at: token scopes (``commands``) and expiry.

Projection columns of ``tokens/<id>`` streams, like the rest of ``api_tokens``: ``token.created``
carries ``scopes`` and ``expiresAt``, so ``receipt rebuild-projections`` restores them. Tokens
created before this migration have no scopes and never expire, exactly what their receipts say.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:
        batch.add_column(sa.Column("scopes", sa.String(256), nullable=True))
        batch.add_column(sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("api_tokens") as batch:
        batch.drop_column("expires_at")
        batch.drop_column("scopes")
