"""Base schema: runs, events, messages, snapshots (without `state`), snapshot keys, tool effects, media.

Messages are stored per history position and version; a snapshot names its history with
`history_length` and `through_message` (see `step_persistence.stores.sql.schema`).

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from step_persistence.migrations.naming import names, refuse_a_clash
from step_persistence.stores.sql.types import JSON_DOCUMENT, DateTimeUTC, EncodedJSON

revision = '0001'
down_revision: str | None = None
branch_labels: str | None = None
depends_on: str | None = None

SERIAL = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')


_TABLES = ['runs', 'events', 'messages', 'snapshots', 'snapshot_keys', 'tool_effects', 'media']


def _run_fk(table: str) -> sa.ForeignKeyConstraint:
    n = names()
    return sa.ForeignKeyConstraint(
        ['run_id'], [f'{n.table("runs")}.run_id'], name=n.object(f'fk_{table}_run_id_runs'), ondelete='CASCADE'
    )


def upgrade() -> None:
    refuse_a_clash(_TABLES)
    n = names()
    op.create_table(
        n.table('runs'),
        sa.Column('id', SERIAL, primary_key=True, autoincrement=True),
        sa.Column('run_id', sa.String(), nullable=False),
        sa.Column('conversation_id', sa.String(), nullable=True),
        sa.Column('parent_run_id', sa.String(), nullable=True),
        sa.Column('agent_name', sa.String(), nullable=True),
        sa.Column('metadata', JSON_DOCUMENT, nullable=False),
        sa.Column('started_at', DateTimeUTC(), nullable=False),
        sa.Column('last_snapshot_seq', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
        sa.Column('last_message_no', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
        sa.PrimaryKeyConstraint('id', name=n.object('pk_runs')),
        sa.UniqueConstraint('run_id', name=n.object('uq_runs_run_id')),
        sqlite_autoincrement=True,
    )
    op.create_index(n.object('ix_runs_started_at_id'), n.table('runs'), ['started_at', 'id'])
    op.create_index(
        n.object('ix_runs_conversation_id_started_at_id'), n.table('runs'), ['conversation_id', 'started_at', 'id']
    )
    op.create_index(
        n.object('ix_runs_parent_run_id_started_at_id'), n.table('runs'), ['parent_run_id', 'started_at', 'id']
    )

    op.create_table(
        n.table('events'),
        sa.Column('id', SERIAL, primary_key=True, autoincrement=True),
        sa.Column('run_id', sa.String(), nullable=False),
        sa.Column('kind', sa.String(), nullable=False),
        sa.Column('step_index', sa.Integer(), nullable=False),
        sa.Column('timestamp', DateTimeUTC(), nullable=False),
        sa.Column('conversation_id', sa.String(), nullable=True),
        sa.Column('parent_run_id', sa.String(), nullable=True),
        sa.Column('agent_name', sa.String(), nullable=True),
        sa.Column('tool_call_id', sa.String(), nullable=True),
        sa.Column('tool_name', sa.String(), nullable=True),
        sa.Column('error', sa.Text(), nullable=True),
        sa.Column('metadata', JSON_DOCUMENT, nullable=False),
        sa.Column('idempotency_key', sa.String(), nullable=True),
        sa.PrimaryKeyConstraint('id', name=n.object('pk_events')),
        _run_fk('events'),
    )
    op.create_index(n.object('ix_events_run_id_id'), n.table('events'), ['run_id', 'id'])
    key_is_set = sa.text('idempotency_key IS NOT NULL')
    op.create_index(
        n.object('uq_events_run_id_idempotency_key'),
        n.table('events'),
        ['run_id', 'idempotency_key'],
        unique=True,
        sqlite_where=key_is_set,
        postgresql_where=key_is_set,
    )

    op.create_table(
        n.table('messages'),
        sa.Column('run_id', sa.String(), nullable=False),
        sa.Column('no', sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column('position', sa.Integer(), nullable=False),
        sa.Column('digest', sa.String(64), nullable=False),
        sa.Column('body', EncodedJSON(), nullable=False),
        sa.Column('externalized', sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint('run_id', 'no', name=n.object('pk_messages')),
        _run_fk('messages'),
    )
    op.create_index(n.object('ix_messages_run_id_position_no'), n.table('messages'), ['run_id', 'position', 'no'])

    op.create_table(
        n.table('snapshots'),
        sa.Column('run_id', sa.String(), nullable=False),
        sa.Column('seq', sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column('step_index', sa.Integer(), nullable=False),
        sa.Column('timestamp', DateTimeUTC(), nullable=False),
        sa.Column('conversation_id', sa.String(), nullable=True),
        sa.Column('parent_run_id', sa.String(), nullable=True),
        sa.Column('agent_name', sa.String(), nullable=True),
        sa.Column('idempotency_key', sa.String(), nullable=True),
        sa.Column('history_length', sa.Integer(), nullable=False),
        sa.Column('through_message', sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint('run_id', 'seq', name=n.object('pk_snapshots')),
        _run_fk('snapshots'),
    )

    op.create_table(
        n.table('snapshot_keys'),
        sa.Column('run_id', sa.String(), nullable=False),
        sa.Column('idempotency_key', sa.String(), nullable=False),
        sa.PrimaryKeyConstraint('run_id', 'idempotency_key', name=n.object('pk_snapshot_keys')),
        _run_fk('snapshot_keys'),
    )

    op.create_table(
        n.table('tool_effects'),
        sa.Column('run_id', sa.String(), nullable=False),
        sa.Column('tool_call_id', sa.String(), nullable=False),
        sa.Column('tool_name', sa.String(), nullable=False),
        sa.Column('status', sa.String(), nullable=False),
        sa.Column('started_at', DateTimeUTC(), nullable=False),
        sa.Column('ended_at', DateTimeUTC(), nullable=True),
        sa.Column('idempotency_key', sa.String(), nullable=True),
        sa.Column('effect_summary', sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint('run_id', 'tool_call_id', name=n.object('pk_tool_effects')),
        _run_fk('tool_effects'),
    )
    op.create_index(
        n.object('ix_tool_effects_run_id_status_started_at'),
        n.table('tool_effects'),
        ['run_id', 'status', 'started_at'],
    )

    op.create_table(
        n.table('media'),
        sa.Column('digest', sa.String(64), nullable=False),
        sa.Column('data', sa.LargeBinary(), nullable=False),
        sa.Column('media_type', sa.String(), nullable=True),
        sa.Column('filename', sa.String(), nullable=True),
        sa.Column('metadata', JSON_DOCUMENT, nullable=False),
        sa.Column('created_at', DateTimeUTC(), nullable=False),
        sa.PrimaryKeyConstraint('digest', name=n.object('pk_media')),
    )


def downgrade() -> None:
    n = names()
    op.drop_table(n.table('media'))
    op.drop_index(n.object('ix_tool_effects_run_id_status_started_at'), table_name=n.table('tool_effects'))
    op.drop_table(n.table('tool_effects'))
    op.drop_table(n.table('snapshot_keys'))
    op.drop_table(n.table('snapshots'))
    op.drop_index(n.object('ix_messages_run_id_position_no'), table_name=n.table('messages'))
    op.drop_table(n.table('messages'))
    op.drop_index(n.object('uq_events_run_id_idempotency_key'), table_name=n.table('events'))
    op.drop_index(n.object('ix_events_run_id_id'), table_name=n.table('events'))
    op.drop_table(n.table('events'))
    op.drop_index(n.object('ix_runs_parent_run_id_started_at_id'), table_name=n.table('runs'))
    op.drop_index(n.object('ix_runs_conversation_id_started_at_id'), table_name=n.table('runs'))
    op.drop_index(n.object('ix_runs_started_at_id'), table_name=n.table('runs'))
    op.drop_table(n.table('runs'))
