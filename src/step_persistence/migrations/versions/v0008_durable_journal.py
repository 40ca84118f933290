"""The durable journal: `durable_workflows` and `durable_units` (docs/durable.md).

Two new tables, nothing else changes: a database at 0007 upgrades with its runs untouched. The
workflows table carries the lease columns (`owner`, `lease_expires_at`, `fencing_epoch`) that the
recovery of abandoned runs uses, so that recovery needs no revision of its own. The downgrade drops
both tables, and with them every journal (the runs, their events and snapshots stay).

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from step_persistence.migrations.naming import names
from step_persistence.stores.sql.types import JSON_DOCUMENT, DateTimeUTC

revision = '0008'
down_revision: str | None = '0007'
branch_labels: str | None = None
depends_on: str | None = None


def upgrade() -> None:
    n = names()
    op.create_table(
        n.table('durable_workflows'),
        sa.Column('workflow_id', sa.String(), nullable=False),
        sa.Column('agent_name', sa.String(), nullable=True),
        sa.Column('run_id', sa.String(), nullable=True),
        sa.Column('status', sa.String(), nullable=False),
        sa.Column('code_version', sa.String(), nullable=True),
        sa.Column('inputs', JSON_DOCUMENT, nullable=False),
        sa.Column('attempts', sa.Integer(), nullable=False),
        sa.Column('owner', sa.String(), nullable=True),
        sa.Column('lease_expires_at', DateTimeUTC(), nullable=True),
        sa.Column('fencing_epoch', sa.BigInteger(), nullable=False),
        sa.Column('created_at', DateTimeUTC(), nullable=False),
        sa.Column('updated_at', DateTimeUTC(), nullable=False),
        sa.PrimaryKeyConstraint('workflow_id', name=n.object('pk_durable_workflows')),
    )
    op.create_table(
        n.table('durable_units'),
        sa.Column('workflow_id', sa.String(), nullable=False),
        sa.Column('unit_key', sa.String(), nullable=False),
        sa.Column('name', sa.String(), nullable=False),
        sa.Column('kind', sa.String(), nullable=False),
        sa.Column('status', sa.String(), nullable=False),
        sa.Column('tool_call_id', sa.String(), nullable=True),
        sa.Column('fingerprint', sa.String(), nullable=True),
        sa.Column('result', JSON_DOCUMENT, nullable=True),
        sa.Column('error', sa.Text(), nullable=True),
        sa.Column('attempts', sa.Integer(), nullable=False),
        sa.Column('started_at', DateTimeUTC(), nullable=False),
        sa.Column('ended_at', DateTimeUTC(), nullable=True),
        sa.ForeignKeyConstraint(
            ['workflow_id'],
            [f'{n.table("durable_workflows")}.workflow_id'],
            name=n.object('fk_durable_units_workflow_id_durable_workflows'),
            ondelete='CASCADE',
        ),
        sa.PrimaryKeyConstraint('workflow_id', 'unit_key', name=n.object('pk_durable_units')),
    )


def downgrade() -> None:
    n = names()
    op.drop_table(n.table('durable_units'))
    op.drop_table(n.table('durable_workflows'))
