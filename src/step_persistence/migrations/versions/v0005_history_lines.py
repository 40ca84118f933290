"""History lines, origins and conversations: messages numbered per line instead of per run (issue 17).

- `history_lines` (`id`, `last_message_no`, a base view `base_line_id`/`base_length`/`base_through`
  for branches); `messages` are keyed by `(line_id, no)` and no longer name a run; snapshots get
  `line_id` and `history_digest` (`NULL` for the snapshots written before); `runs` lose
  `last_message_no` (it lives on the line now) and get `origin_kind`/`origin_run_id`/`origin_seq`;
  `conversations` holds one summary per conversation.
- Existing data: every run with messages or snapshots gets one line whose id is the run's `id`,
  numbered as the run's messages were; its messages and snapshots move onto it unchanged, so every
  snapshot reads back as before. The summaries are computed from the runs.
- SQLite rebuilds `messages` (batch mode: its key changes); every other change is in place, so the
  reporting views of 0003 (which do not read `messages`) stay as they are.

The downgrade renumbers each run's messages on its own again, replaying its retained snapshots in
order (online only: it reads the data).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from step_persistence.migrations.naming import names
from step_persistence.stores.sql.types import DateTimeUTC, EncodedJSON

revision = '0005'
down_revision: str | None = '0004'
branch_labels: str | None = None
depends_on: str | None = None

SERIAL = sa.BigInteger().with_variant(sa.Integer(), 'sqlite')
CONTINUED = sa.text("origin_kind = 'continued'")


def _messages_with_line() -> sa.Table:
    """`messages` as 0004 left it with `line_id` added: what SQLite's batch mode copies from (also offline)."""
    n = names()
    return sa.Table(
        n.table('messages'),
        sa.MetaData(),
        sa.Column('run_id', sa.String(), nullable=False),
        sa.Column('no', sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column('position', sa.Integer(), nullable=False),
        sa.Column('digest', sa.String(64), nullable=False),
        sa.Column('body', EncodedJSON(), nullable=False),
        sa.Column('externalized', sa.Boolean(), nullable=False),
        sa.Column('line_id', sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint('run_id', 'no', name=n.object('pk_messages')),
        sa.ForeignKeyConstraint(
            ['run_id'], [f'{n.table("runs")}.run_id'], name=n.object('fk_messages_run_id_runs'), ondelete='CASCADE'
        ),
        sa.Index(n.object('ix_messages_run_id_position_no'), 'run_id', 'position', 'no'),
    )


def _create_lines() -> None:
    n = names()
    lines, messages, runs, snapshots = (n.table(name) for name in ('history_lines', 'messages', 'runs', 'snapshots'))
    op.create_table(
        n.table('history_lines'),
        sa.Column('id', SERIAL, primary_key=True, autoincrement=True),
        sa.Column('last_message_no', sa.BigInteger(), server_default=sa.text('0'), nullable=False),
        sa.Column('base_line_id', sa.BigInteger(), nullable=True),
        sa.Column('base_length', sa.Integer(), nullable=True),
        sa.Column('base_through', sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint('id', name=n.object('pk_history_lines')),
        sqlite_autoincrement=True,
    )
    op.create_index(
        n.object('ix_history_lines_base_line_id_base_through'),
        n.table('history_lines'),
        ['base_line_id', 'base_through'],
    )
    op.execute(
        f'INSERT INTO {lines} (id, last_message_no) '
        f'SELECT r.id, COALESCE((SELECT max(m.no) FROM {messages} m WHERE m.run_id = r.run_id), 0) FROM {runs} r '
        f'WHERE EXISTS (SELECT 1 FROM {messages} m WHERE m.run_id = r.run_id) '
        f'OR EXISTS (SELECT 1 FROM {snapshots} s WHERE s.run_id = r.run_id)'
    )
    if op.get_context().dialect.name == 'postgresql':
        op.execute(
            f"SELECT setval(pg_get_serial_sequence('{lines}', 'id'), "
            f'COALESCE((SELECT max(id) FROM {lines}), 0) + 1, false)'
        )


def _move_messages() -> None:
    n = names()
    op.add_column(n.table('messages'), sa.Column('line_id', sa.BigInteger(), nullable=True))
    messages, runs = n.table('messages'), n.table('runs')
    op.execute(f'UPDATE {messages} SET line_id = (SELECT r.id FROM {runs} r WHERE r.run_id = {messages}.run_id)')
    op.execute(f'DELETE FROM {messages} WHERE line_id IS NULL')  # rows of no run: nothing could read them
    with op.batch_alter_table(n.table('messages'), copy_from=_messages_with_line()) as batch:
        batch.drop_index(n.object('ix_messages_run_id_position_no'))
        batch.drop_constraint(n.object('fk_messages_run_id_runs'), type_='foreignkey')
        batch.drop_constraint(n.object('pk_messages'), type_='primary')
        batch.drop_column('run_id')
        batch.alter_column('line_id', existing_type=sa.BigInteger(), nullable=False)
        batch.create_primary_key(n.object('pk_messages'), ['line_id', 'no'])
    op.create_index(n.object('ix_messages_line_id_position_no'), n.table('messages'), ['line_id', 'position', 'no'])


def _move_snapshots() -> None:
    n = names()
    op.add_column(n.table('snapshots'), sa.Column('line_id', sa.BigInteger(), nullable=True))
    op.add_column(n.table('snapshots'), sa.Column('history_digest', sa.String(64), nullable=True))
    snapshots, runs = n.table('snapshots'), n.table('runs')
    op.execute(f'UPDATE {snapshots} SET line_id = (SELECT r.id FROM {runs} r WHERE r.run_id = {snapshots}.run_id)')
    op.create_index(
        n.object('ix_snapshots_line_id_through_message'), n.table('snapshots'), ['line_id', 'through_message']
    )
    op.create_index(
        n.object('ix_snapshots_conversation_id_history_digest'),
        n.table('snapshots'),
        ['conversation_id', 'history_digest'],
    )


def _runs_with_origins() -> None:
    n = names()
    op.add_column(n.table('runs'), sa.Column('origin_kind', sa.String(), nullable=True))
    op.add_column(n.table('runs'), sa.Column('origin_run_id', sa.String(), nullable=True))
    op.add_column(n.table('runs'), sa.Column('origin_seq', sa.BigInteger(), nullable=True))
    # A plain ALTER TABLE ... DROP COLUMN (SQLite 3.35+): batch mode would copy the table under the views.
    op.drop_column(n.table('runs'), 'last_message_no')
    op.create_index(n.object('ix_runs_agent_name_started_at_id'), n.table('runs'), ['agent_name', 'started_at', 'id'])
    op.create_index(
        n.object('ix_runs_agent_name_conversation_id_started_at_id'),
        n.table('runs'),
        ['agent_name', 'conversation_id', 'started_at', 'id'],
    )
    op.create_index(
        n.object('ix_runs_origin_run_id_started_at_id'), n.table('runs'), ['origin_run_id', 'started_at', 'id']
    )
    op.create_index(
        n.object('uq_runs_origin_run_id_origin_seq'),
        n.table('runs'),
        ['origin_run_id', 'origin_seq'],
        unique=True,
        sqlite_where=CONTINUED,
        postgresql_where=CONTINUED,
    )


def _create_conversations() -> None:
    n = names()
    runs = n.table('runs')
    op.create_table(
        n.table('conversations'),
        sa.Column('conversation_id', sa.String(), nullable=False),
        sa.Column('first_started_at', DateTimeUTC(), nullable=False),
        sa.Column('last_started_at', DateTimeUTC(), nullable=False),
        sa.Column('run_count', sa.BigInteger(), nullable=False),
        sa.Column('head_run_pk', sa.BigInteger(), nullable=False),
        sa.Column('head_run_id', sa.String(), nullable=False),
        sa.PrimaryKeyConstraint('conversation_id', name=n.object('pk_conversations')),
    )
    op.create_index(
        n.object('ix_conversations_last_started_at_conversation_id'),
        n.table('conversations'),
        ['last_started_at', 'conversation_id'],
    )
    op.execute(
        f'INSERT INTO {n.table("conversations")} '
        '(conversation_id, first_started_at, last_started_at, run_count, head_run_pk, head_run_id) '
        'SELECT r.conversation_id, '
        f'(SELECT min(f.started_at) FROM {runs} f WHERE f.conversation_id = r.conversation_id), '
        'r.started_at, '
        f'(SELECT count(*) FROM {runs} c WHERE c.conversation_id = r.conversation_id), '
        'r.id, r.run_id '
        f'FROM {runs} r WHERE r.conversation_id IS NOT NULL AND NOT EXISTS ('
        f'SELECT 1 FROM {runs} later WHERE later.conversation_id = r.conversation_id '
        'AND (later.started_at > r.started_at OR (later.started_at = r.started_at AND later.id > r.id)))'
    )


def upgrade() -> None:
    _create_lines()
    _move_messages()
    _move_snapshots()
    _runs_with_origins()
    _create_conversations()


def _messages_with_run() -> sa.Table:
    """`messages` as this revision leaves it, with 0004's `run_id` added: what the downgrade copies from."""
    n = names()
    return sa.Table(
        n.table('messages'),
        sa.MetaData(),
        sa.Column('line_id', sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column('no', sa.BigInteger(), autoincrement=False, nullable=False),
        sa.Column('position', sa.Integer(), nullable=False),
        sa.Column('digest', sa.String(64), nullable=False),
        sa.Column('body', EncodedJSON(), nullable=False),
        sa.Column('externalized', sa.Boolean(), nullable=False),
        sa.Column('run_id', sa.String(), nullable=True),
        sa.PrimaryKeyConstraint('line_id', 'no', name=n.object('pk_messages')),
    )


def downgrade() -> None:
    from step_persistence.migrations.renumbering import insert_renumbered, renumber_per_run

    n = names()
    renumbered = renumber_per_run(op.get_bind(), n)
    op.drop_index(n.object('ix_conversations_last_started_at_conversation_id'), table_name=n.table('conversations'))
    op.drop_table(n.table('conversations'))
    op.drop_index(n.object('uq_runs_origin_run_id_origin_seq'), table_name=n.table('runs'))
    op.drop_index(n.object('ix_runs_origin_run_id_started_at_id'), table_name=n.table('runs'))
    op.drop_index(n.object('ix_runs_agent_name_conversation_id_started_at_id'), table_name=n.table('runs'))
    op.drop_index(n.object('ix_runs_agent_name_started_at_id'), table_name=n.table('runs'))
    op.drop_column(n.table('runs'), 'origin_seq')
    op.drop_column(n.table('runs'), 'origin_run_id')
    op.drop_column(n.table('runs'), 'origin_kind')
    op.add_column(
        n.table('runs'), sa.Column('last_message_no', sa.BigInteger(), server_default=sa.text('0'), nullable=False)
    )
    op.drop_index(n.object('ix_messages_line_id_position_no'), table_name=n.table('messages'))
    op.execute(f'DELETE FROM {n.table("messages")}')
    op.add_column(n.table('messages'), sa.Column('run_id', sa.String(), nullable=True))
    with op.batch_alter_table(n.table('messages'), copy_from=_messages_with_run()) as batch:
        batch.drop_constraint(n.object('pk_messages'), type_='primary')
        batch.drop_column('line_id')
        batch.alter_column('run_id', existing_type=sa.String(), nullable=False)
        batch.create_primary_key(n.object('pk_messages'), ['run_id', 'no'])
        batch.create_foreign_key(
            n.object('fk_messages_run_id_runs'), n.table('runs'), ['run_id'], ['run_id'], ondelete='CASCADE'
        )
    op.create_index(n.object('ix_messages_run_id_position_no'), n.table('messages'), ['run_id', 'position', 'no'])
    insert_renumbered(op.get_bind(), renumbered, n)
    op.drop_index(n.object('ix_snapshots_conversation_id_history_digest'), table_name=n.table('snapshots'))
    op.drop_index(n.object('ix_snapshots_line_id_through_message'), table_name=n.table('snapshots'))
    op.drop_column(n.table('snapshots'), 'history_digest')
    op.drop_column(n.table('snapshots'), 'line_id')
    op.drop_index(n.object('ix_history_lines_base_line_id_base_through'), table_name=n.table('history_lines'))
    op.drop_table(n.table('history_lines'))
