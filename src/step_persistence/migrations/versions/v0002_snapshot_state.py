"""Snapshots get a `state` (`complete` or `interrupted`); rows written before it read as `complete`.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from step_persistence.migrations.naming import names

revision = '0002'
down_revision: str | None = '0001'
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    n = names()
    # A plain-string default lets SQLite add the column in place (no table copy), also in --sql mode.
    with op.batch_alter_table(n.table('snapshots')) as batch:
        batch.add_column(sa.Column('state', sa.String(), server_default='complete', nullable=False))
        batch.create_index(n.object('ix_snapshots_run_id_state_seq'), ['run_id', 'state', 'seq'])


def downgrade() -> None:
    n = names()
    with op.batch_alter_table(n.table('snapshots')) as batch:
        batch.drop_index(n.object('ix_snapshots_run_id_state_seq'))
        batch.drop_column('state')
