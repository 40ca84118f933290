"""Media blobs get a `touched_at` (when last put again or reused), for `collect_media`'s grace period.

Rows written before it have `NULL`, which reads as their `created_at`. Both directions alter the
table in place on SQLite too (no table copy, so the reporting views of 0003 stay untouched).

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from step_persistence.migrations.naming import names
from step_persistence.stores.sql.types import DateTimeUTC

revision = '0004'
down_revision: str | None = '0003'
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column(names().table('media'), sa.Column('touched_at', DateTimeUTC(), nullable=True))


def downgrade() -> None:
    # A plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+): batch mode would copy the table.
    op.drop_column(names().table('media'), 'touched_at')
