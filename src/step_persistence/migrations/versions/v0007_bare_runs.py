"""Runs get `bare`: registered by a write to a run never registered, not yet by `register_run`.

Every run stored before this revision was registered by `register_run`, so the column is added
`NOT NULL DEFAULT false` (in place on both dialects: no table copy under the reporting views).
The downgrade drops the column: a bare run stays, as a run registered with its id and
`started_at` alone, which the code of revision 0006 reads as such (and a `register_run` of its
id there raises `ValueError`).

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from step_persistence.migrations.naming import names

revision = '0007'
down_revision: str | None = '0006'
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    op.add_column(
        names().table('runs'), sa.Column('bare', sa.Boolean(), server_default=sa.text('false'), nullable=False)
    )


def downgrade() -> None:
    # A plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+): batch mode would copy the table.
    op.drop_column(names().table('runs'), 'bare')
